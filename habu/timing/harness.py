"""Measuring a compiled model on the GPU the way METHOD.md asks: fresh random inputs for every
check, poisoned outputs, a float64 reference, dtype-aware tolerances, CUDA-event timing with
warm-up, the median of many runs, and inputs rotated so the L2 cache does not flatter.

torch is used here (and only here and in the baselines) to make GPU arrays; the core never needs it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from habu.spec.ir import Model

TORCH_DTYPE = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "i32": "int32",
               "i64": "int64", "i16": "int16"}


def torch():
    import torch as t

    return t


def make_inputs(model: Model, sizes: Mapping[str, int], seed: int, index: str = "random",
                device: str = "cuda") -> dict[str, Any]:
    """Random inputs (never zeros): N(0,1) floats; index tensors random with duplicates, a
    permutation, or all-duplicate ("dup"), as asked; a grouping's (`GROUPS:`) sorted."""
    t = torch()
    g = t.Generator(device="cpu").manual_seed(seed)
    out = {}
    for decl in model.inputs:
        shape = tuple(sizes[e] for e in decl.extents)
        if decl.is_index:
            hi = sizes[decl.range]  # type: ignore[index]
            n = int(np.prod(shape)) if shape else 1
            if index == "perm" and n <= hi:
                v = t.randperm(hi, generator=g)[:n]
            elif index == "dup":
                v = t.randint(0, max(1, min(hi, 7)), (n,), generator=g)
            else:
                v = t.randint(0, hi, (n,), generator=g)
            if decl.grouped:  # a grouping's values never decrease (GROUPS:); unchosen groups stay empty
                v = t.sort(v).values
            out[decl.name] = v.reshape(shape).to(getattr(t, TORCH_DTYPE[decl.dtype.name])).to(device)
        else:
            dt = getattr(t, TORCH_DTYPE[decl.dtype.name if decl.dtype else "f32"])
            out[decl.name] = t.randn(shape, generator=g, dtype=t.float32).to(dt).to(device)
    return out


def poisoned_outputs(model: Model, sizes: Mapping[str, int], device: str = "cuda") -> dict[str, Any]:
    """Output buffers full of NaN: an element the kernel never writes stays NaN and fails the check."""
    t = torch()
    out = {}
    inputs = {d.name for d in model.inputs}
    for decl in model.outputs:
        if decl.name in inputs:
            continue  # updated in place: the input is the output buffer
        shape = tuple(sizes[e] for e in decl.extents)
        dt = getattr(t, TORCH_DTYPE[decl.dtype.name if decl.dtype else "f32"])
        out[decl.name] = t.full(shape, float("nan"), dtype=dt, device=device)
    return out


def reference(model: Model, inputs: Mapping[str, Any], sizes: Mapping[str, int]) -> dict[str, np.ndarray]:
    """The model's float64 semantics on the same (rounded) inputs."""
    from habu.spec.reference import evaluate

    host = {k: v.detach().to("cpu").double().numpy() if v.is_floating_point() else v.to("cpu").numpy()
            for k, v in inputs.items()}
    return evaluate(model, host, dict(sizes))


def tolerance(model: Model, storage: Mapping[str, str], kernels: Sequence[Any] = ()) -> float:
    """Relative error allowed: 16-bit stages round at 2^-8..2^-11; float32 pipelines accumulate ~1e-6.
    `kernels`: the plan's, whose `internal_stage` is a rounding inside a kernel (the fused attention's P
    in bf16), counted like a stored stage."""
    stages = [t.dtype.name for t in model.outputs if t.dtype] + list(storage.values())
    stages += [s for s in (getattr(k, "internal_stage", None) for k in kernels) if s]
    if any(s in ("bf16",) for s in stages):
        return 2e-2
    if any(s in ("f16",) for s in stages):
        return 5e-3
    return 1e-4


def plan_tolerance(model: Model, plan: Any) -> float:
    """The tolerance for `plan`'s outputs: its storage and the roundings inside its kernels. Harnesses
    holding a plan call this, not `tolerance`, so no kernel's internal bf16 stage can be left out."""
    return tolerance(model, dict(plan.storage), plan.kernels)


@dataclass
class Golden:
    rel_error: float
    tol: float
    unwritten: int

    @property
    def ok(self) -> bool:
        return self.unwritten == 0 and np.isfinite(self.rel_error) and self.rel_error <= self.tol


def compare(out: Any, ref: np.ndarray, tol: float) -> Golden:
    got = out.detach().to("cpu").double().numpy()
    return Golden(relative_error(got, ref), tol, int(np.isnan(got).sum()))


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """‖got − ref‖ / ‖ref‖ over the finite elements of ref (NaN in got: unwritten, counted apart, as 0 here); an
    infinity of ref matched by the same one in got (a fully masked row's maximum, −∞) is equal and left out, and
    one that is not (−FLT_MAX where the model says −∞) makes the error infinite."""
    ref = np.asarray(ref, dtype=np.float64)
    got = np.broadcast_to(np.asarray(got, dtype=np.float64), ref.shape)
    infinite = np.isinf(ref) | np.isinf(got)
    if np.any(infinite & (got != ref)):
        return float("inf")
    kept = ~infinite
    diff = np.linalg.norm((np.nan_to_num(got[kept]) - ref[kept]).ravel())
    norm = np.linalg.norm(ref[kept].ravel()) or 1.0
    return float(diff / norm)


def golden_run(model: Model, sizes: Mapping[str, int], compiled: Callable[..., Any], storage: Mapping[str, str],
               seed: int) -> Golden:
    """One golden check: fresh inputs from `seed`, NaN-poisoned outputs, the model's first output against
    the float64 reference within the plan's tolerance."""
    inputs = make_inputs(model, sizes, seed)
    outs = poisoned_outputs(model, sizes)
    ref = reference(model, inputs, sizes)
    got = compiled(**inputs, **outs)
    torch().cuda.synchronize()
    name = model.outputs[0].name
    got = got[name] if isinstance(got, dict) else got
    return compare(got, ref[name], tolerance(model, storage))


def time_cuda(fn: Callable[[int], Any], sets: int, warmup: int = 5, reps: int = 30) -> dict[str, float]:
    """Median, p20 and p80 of `reps` timed calls (microseconds), cycling through `sets` input sets.

    Each call sits between two events, and the calls are queued behind a GPU sleep long enough to
    cover the CPU's time to queue them all: the GPU then runs them back to back and no call's
    events count time the GPU spent waiting for the CPU (a timing process preempted by compile
    workers made torch's 218 µs baseline read 395 µs on the H200, 2026-11-30)."""
    t = torch()
    for i in range(warmup):
        fn(i % sets)
    t.cuda.synchronize()
    began = time.perf_counter()
    fn(0)
    enqueue_s = time.perf_counter() - began  # the CPU's time to queue one call
    t.cuda.synchronize()
    starts = [t.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [t.cuda.Event(enable_timing=True) for _ in range(reps)]
    ahead_s = min(1.0, 2.0 * reps * (enqueue_s + 20e-6))
    sleep = getattr(t.cuda, "_sleep", None)
    if sleep is not None:
        sleep(int(ahead_s * GPU_CLOCK_HZ))
    for i in range(reps):
        starts[i].record()
        fn(i % sets)
        ends[i].record()
    t.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends, strict=True))
    return {"median_us": statistics.median(times), "p20_us": times[len(times) // 5],
            "p80_us": times[(4 * len(times)) // 5], "samples": times}


GPU_CLOCK_HZ = 2.0e9  # cycles per second for the queue-filling sleep: at or above an H100/H200's boost clock


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + written), measured now."""
    t = torch()
    src = t.empty(nbytes // 2, dtype=t.uint8, device="cuda")
    dst = t.empty_like(src)
    r = time_cuda(lambda i: dst.copy_(src), sets=1, warmup=3, reps=20)
    return 2 * src.numel() / (r["median_us"] * 1e-6)
