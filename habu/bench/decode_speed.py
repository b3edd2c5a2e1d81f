"""Decode and small-batch shapes (issue 20 §2): Habu's default plan and searched-space variants
against cuBLAS, torch eager and torch.compile in the same run, as fractions of the weight-streaming
floor.

    python -m habu.bench.decode_speed [--json OUT.json] [--only CASE[,CASE...]] [--variants PART[,PART...]]
                                      [--no-compile]

Cases: GGEMM 64x4096x4096 (examples/ggemm.habu; cuBLAS on rows gathered beforehand), FFN-SKIP at 16
and 128 tokens (examples/ffn_skip.habu: D 4096, H 14336), RMSNorm+Linear at 16 tokens
(examples/rmsnorm_linear.habu). Each case times its default plan and variants of the searched
space (pins per kernel, `VARIANTS`). Every plan is proven (rules + a finite-field trial), emitted
and compiled in a pool of worker processes while torch.compile traces the baselines; then, on the
GPU, each is checked before it is timed: the exact check (habu.timing.exact: small-integer inputs,
every output element bit for bit, red zones) where the model is integer-exact, and a golden check
(fresh random inputs, NaN-poisoned outputs, float64 reference) always. A variant that fails to
build or check is reported on its row, not fatal; the exit status is 1 only if a default fails.

Timing: CUDA events, 5 warm-ups, the median of 30 calls queued behind a GPU sleep, input sets
rotated past the L2 (habu.bench.gpu_bench's `sets_for`). The floor is the weights' bytes over the
H200's measured copy bandwidth (4.22 TB/s; the copy measured now is printed too).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path
from typing import Any

EX = Path(__file__).resolve().parents[2] / "examples"
COPY_TBPS = 4.22  # the H200's device-to-device copy (docs/PERF.md, 2026-11-30)
ARCH = "sm_90a"

# per-kernel pins (kernel index -> pins; "*" for every contraction kernel; "plan": plan-wide pins such as
# a rewrite, applied first), by variant name
Pins = dict[Any, dict[str, str]]
WGMMA_OLD_DEFAULT = {"tile": "128x128x64", "warps": "12", "stages": "5", "swap_ab": "false"}
MMA_SYNC = {"mma": "mma.sync"}


@dataclass(frozen=True)
class Case:
    name: str
    example: str
    model: str
    sizes: dict[str, int]
    weights: tuple[str, ...]  # the tensors whose bytes make the floor
    variants: dict[str, Pins] = field(default_factory=dict)


def _tile(tile: str, stages: int, split: int | None = None, bk: int = 64, **more: str) -> dict[str, str]:
    """Pins of a tile (k tile `bk`) and depth; with `split`, an atomic split (or unsplit) unless
    `split_reduce` says."""
    pins = {"swap_ab": "false", "tile": f"{tile}x{bk}", "stages": str(stages), **more}  # (the product as written)
    return pins | ({"split_k": str(split), "split_reduce": more.get("split_reduce", "atomic")}
                   if split is not None else {})


def _cluster(tile: str, stages: int, split: int, bk: int = 64, **more: str) -> dict[str, str]:
    """A cluster split (habu/lower/split_cluster.py): the split blocks of a tile add their partials in
    distributed shared memory, any epilogue, no zero fill."""
    return _tile(tile, stages, split, bk, split_reduce="cluster", **more)


def _swap(tile: str, stages: int, split: int = 1, ahead: bool = False) -> dict[str, str]:
    """Pins of a transposed tile (`swap_ab`: weight rows x tokens), unsplit or split by a cluster; `ahead`: the
    weights' (A's) first boxes before the wait for the plan's previous kernel (`a_ahead`)."""
    return _tile(tile, stages, split, swap_ab="true", **({"split_reduce": "cluster"} if split > 1 else {}),
                 a_ahead="true" if ahead else "false")


AHEAD = {"b_ahead": "true"}  # B's TMA boxes of a tile's first stages before anything else (MbarrierRing.ahead)
OLD_SKINNY = _tile("64x128", 8, 1)  # the skinny default before cluster splits (session 29)
CASES = [
    Case("ggemm-64x4096x4096", "ggemm.habu", "GGEMM", {"M": 64, "N": 4096, "K": 4096}, ("B",), {
        "64x128 s8 split 2 (the default before)": {"*": _tile("64x128", 8, 2)},
        "64x64 s14 split 2 atomic": {"*": _tile("64x64", 14, 2)},
        "64x128 s8 split 4 (first skinny default)": {"*": _tile("64x128", 8, 4)},
        "64x32 s12 split 1 (no atomics)": {"*": _tile("64x32", 12, 1)},
        "persistent split 2": {"*": {**_tile("64x128", 8, 2), "persistent": "true"}},
        "mma.sync 64x64 s4 split 2": {"*": {**MMA_SYNC, **_tile("64x64", 4, 2, warps="4")}},
        "cluster 64x128 s8 split 4": {"*": _cluster("64x128", 8, 4)},
        "cluster 64x64 s8 split 2": {"*": _cluster("64x64", 8, 2)},
        "cluster 64x96 s10 split 2": {"*": _cluster("64x96", 10, 2)},
        # clusters of 4 within one wave (the H200 runs about 30 at once): fewer bytes per block than 64x64
        # split 2 (A re-read 64/144 of B's bytes instead of once)
        "cluster 64x144 s8 split 4": {"*": _cluster("64x144", 8, 4)},
        "cluster 64x160 s7 split 4": {"*": _cluster("64x160", 7, 4)},
        # bytes in flight per SM (A and B, 16 KB a stage of 64x64) against the kernel time: ring 2..6
        **{f"ring 64x64 s{st} cluster split 2": {"*": _cluster("64x64", st, 2)} for st in (2, 3, 4, 6)},
        # k tiles of 256 / 512 bytes a weight row (B's rows, contiguous along k): 2 / 4 boxes along k a stage
        "ktile 64x64x128 s6 cluster split 2": {"*": _cluster("64x64", 6, 2, bk=128)},
        "ktile 64x64x128 s3 cluster split 2": {"*": _cluster("64x64", 3, 2, bk=128)},
        "ktile 64x64x256 s3 cluster split 2": {"*": _cluster("64x64", 3, 2, bk=256)},
        # B's boxes of the first stages before A's gathered row offsets (the IX loads)
        "ahead (default, B ahead)": {"*": AHEAD},
        "ahead ktile 64x64x128 s6 cluster split 2": {"*": {**_cluster("64x64", 6, 2, bk=128), **AHEAD}},
        # transposed (weight rows x the 64 tokens): no padded token rows, the weights' boxes the tile's A
        "swap 128x64 s8 cluster split 4": {"*": _swap("128x64", 8, 4)},
        "swap 128x64 s6 cluster split 4": {"*": _swap("128x64", 6, 4)},
        "swap 64x64 s12 cluster split 2": {"*": _swap("64x64", 12, 2)},
        "swap 64x64 s8 cluster split 2": {"*": _swap("64x64", 8, 2)},
    }),
    # the same plans over a quarter and four times the weights: the kernel time against the bytes, whose
    # intercept is the kernel's fixed cost (launch, ring fill, epilogue) and slope its streaming rate
    # (at K 16384 the default is 64x64 s14 cluster split 2 already)
    *(Case(f"ggemm-64x4096x{k}", "ggemm.habu", "GGEMM", {"M": 64, "N": 4096, "K": k}, ("B",), {
        **({"sweep 64x64 s14 cluster split 2": {"*": _cluster("64x64", 14, 2)}} if k == 1024 else {}),
        "sweep ktile 64x64x128 s6 cluster split 2": {"*": _cluster("64x64", 6, 2, bk=128)},
        "sweep ahead (default, B ahead)": {"*": AHEAD},
    }) for k in (1024, 16384)),
    Case("ggemm-16x4096x4096", "ggemm.habu", "GGEMM", {"M": 16, "N": 4096, "K": 4096}, ("B",), {
        "unswapped 64x32 s16 (the default before)": {"*": _tile("64x32", 16, 1)},
        "swap 64x16 s16 unsplit": {"*": _swap("64x16", 16)},
        "swap 128x16 s12 cluster split 4": {"*": _swap("128x16", 12, 4)},
        "swap 64x16 s22 cluster split 2": {"*": _swap("64x16", 22, 2)},
        "swap 64x16 s16 cluster split 2 A ahead": {"*": _swap("64x16", 16, 2, ahead=True)},
    }),
    Case("ffn-skip-16", "ffn_skip.habu", "FFN-SKIP", {"B": 16}, ("W1", "W2"), {
        "unswapped (the default before)": {0: _tile("64x128", 8, 1), 1: _cluster("64x64", 14, 2)},
        "swap first, second unswapped": {1: _cluster("64x64", 14, 2)},
        "swap first, second unswapped B ahead": {1: {**_cluster("64x64", 14, 2), **AHEAD}},
        "swap second 64x16 s16 unsplit": {1: _swap("64x16", 16)},
        "swap second 128x16 s12 cluster split 4": {1: _swap("128x16", 12, 4)},
        "swap first 128x16 s8": {0: _swap("128x16", 8)},
        "swap second 64x16 s22 cluster split 2": {1: _swap("64x16", 22, 2)},
        "swap second 64x16 s16 cluster split 2, no A ahead": {1: _swap("64x16", 16, 2)},
        "swap second 64x16 s22 cluster split 2 A ahead": {1: _swap("64x16", 22, 2, ahead=True)},
        "64x128 s8 both (the default before)": {"*": OLD_SKINNY},
        "before skinny (128x128x5, 64x64x6)": {0: WGMMA_OLD_DEFAULT, 1: _tile("64x64", 6, 1)},
        "second 64x64 s13 (first skinny default)": {1: _tile("64x64", 13, 1)},
        "mma.sync both": {"*": {**MMA_SYNC, "split_k": "1", "split_reduce": "atomic"}},
        "second cluster 64x64 s10 split 2": {1: _cluster("64x64", 10, 2)},
        "second cluster 64x128 s8 split 2": {1: _cluster("64x128", 8, 2)},
        "first cluster 64x256 s4 split 2": {0: _cluster("64x256", 4, 2)},
        # wider n-major tiles read longer runs of each weight row per stage (tile_n x 2 bytes)
        "second cluster 64x256 s4 split 4": {1: _cluster("64x256", 4, 4)},
        "second cluster 64x192 s5 split 4": {1: _cluster("64x192", 5, 4)},
        # the first GEMM's ring (24 KB a stage of 64x128, 112 blocks) against its kernel time
        **{f"ring first 64x128 s{st}": {0: _tile("64x128", st, 1)} for st in (3, 4, 6)},
        # k tiles of 128 / 256 rows of the n-major weights a stage (boxes of 64 columns by bk rows)
        "ktile first 64x128x128 s4": {0: _tile("64x128", 4, 1, bk=128)},
        "ktile first 64x128x256 s2": {0: _tile("64x128", 2, 1, bk=256)},
        "ktile second 64x64x128 s6 cluster split 2": {1: _cluster("64x64", 6, 2, bk=128)},
        "ktile second 64x64x256 s3 cluster split 2": {1: _cluster("64x64", 3, 2, bk=256)},
        # the down projection's first W2 boxes before its wait for the first GEMM (PDL: it starts early)
        "ahead second (B ahead)": {1: AHEAD},
        "ahead both (B ahead)": {"*": AHEAD},
    }),
    Case("ffn-skip-128", "ffn_skip.habu", "FFN-SKIP", {"B": 128}, ("W1", "W2"), {
        "before (128x128x5, 64x64x6)": {0: WGMMA_OLD_DEFAULT, 1: {"stages": "6"}},
        "first 64x128 s8": {0: _tile("64x128", 8)},
        "128-row tiles": {"*": _tile("128x64", 8, warps="12")},
        "mma.sync both": {"*": MMA_SYNC},
        "second cluster 128x128 s6 split 2": {1: _cluster("128x128", 6, 2, warps="12")},
        "second cluster 128x64 s8 split 2": {1: _cluster("128x64", 8, 2, warps="12")},
        "ktile second cluster 128x64x128 s4 split 2": {1: _cluster("128x64", 4, 2, bk=128, warps="12")},
        "ktile first 128x128x128 s3": {0: _tile("128x128", 3, bk=128, warps="12")},
        "ahead second (B ahead)": {1: AHEAD},
        "swap first 128x128 s5": {0: _swap("128x128", 5)},
        "swap first 64x128 s6": {0: _swap("64x128", 6)},
        "swap second 128x128 s5 cluster split 4": {1: _swap("128x128", 5, 4)},
        "swap second 64x128 s6 cluster split 2": {1: _swap("64x128", 6, 2)},
        "swap second 64x128 s6 cluster split 2 A ahead": {1: _swap("64x128", 6, 2, ahead=True)},
    }),
    Case("rmsnorm-linear-16", "rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 16}, ("W",), {
        "unswapped 64x128 s8 (the default before)": {1: _tile("64x128", 8, 1)},
        "swap 64x16 s16 unsplit": {1: _swap("64x16", 16)},
        "swap 128x16 s12 cluster split 4": {1: _swap("128x16", 12, 4)},
        "unswapped factor:Y 64x128 s8": {"plan": {"rewrite": "factor:Y"}, 1: _tile("64x128", 8, 1)},
        "swap 64x16 s22 cluster split 2": {1: _swap("64x16", 22, 2)},
        "swap 64x16 s16 cluster split 2, no A ahead": {1: _swap("64x16", 16, 2)},
        "swap 64x16 s22 cluster split 2 A ahead": {1: _swap("64x16", 22, 2, ahead=True)},
        "swap factor:Y 64x16 s22 cluster split 2 A ahead": {"plan": {"rewrite": "factor:Y"},
                                                           1: _swap("64x16", 22, 2, ahead=True)},
        "64x64 s13 (first skinny default)": {1: _tile("64x64", 13)},
        "mma.sync 32x32 s8": {1: {**MMA_SYNC, **_tile("32x32", 8, warps="4")}},
        "cluster 64x128 s8 split 2": {1: _cluster("64x128", 8, 2)},
        "cluster 64x256 s4 split 4": {1: _cluster("64x256", 4, 4)},
        "cluster 64x256 s4 split 2": {1: _cluster("64x256", 4, 2)},
        "factor:Y": {"plan": {"rewrite": "factor:Y"}},
        "factor:Y, cluster 64x64 s13 split 2": {"plan": {"rewrite": "factor:Y"}, 1: _cluster("64x64", 13, 2)},
        "factor:Y, cluster 64x128 s8 split 2": {"plan": {"rewrite": "factor:Y"}, 1: _cluster("64x128", 8, 2)},
        "ktile 64x128x128 s4": {1: _tile("64x128", 4, bk=128)},
        "ktile cluster 64x64x128 s6 split 2": {1: _cluster("64x64", 6, 2, bk=128)},
        "ktile factor:Y, cluster 64x64x128 s6 split 2": {"plan": {"rewrite": "factor:Y"},
                                                        1: _cluster("64x64", 6, 2, bk=128)},
        # W's first boxes before the wait for the RMSNorm kernel (PDL: the GEMM starts while it runs)
        "ahead (B ahead)": {1: AHEAD},
        "ahead cluster 64x64 s13 split 2 (B ahead)": {1: {**_cluster("64x64", 13, 2), **AHEAD}},
    }),
]


def select_variants(case: Case, parts: list[str]) -> Case:
    """The case with only the variants whose names contain one of `parts` (the default always runs)."""
    return replace(case, variants={k: v for k, v in case.variants.items() if any(p and p in k for p in parts)})


def floor_us(weight_bytes: int, tbps: float = COPY_TBPS) -> float:
    """The weight-streaming floor: every weight byte read once at the copy bandwidth."""
    return weight_bytes / (tbps * 1e12) * 1e6


def case_model(case: Case):
    from habu.spec.parser import load_program

    return load_program(EX / case.example).models[case.model].with_sizes(case.sizes)


def variant_plan(case: Case, pins: Pins):
    """The case's default plan with `pins` applied to the kernels they name (a pinned `mma` rebuilds
    that kernel from its path's analytic default first, as `--pin mma=` does)."""
    from habu.paths import contraction_path
    from habu.plan.patterns import default_regions
    from habu.plan.plan import ContractionKernel
    from habu.plan.rewrite import apply_rewrites
    from habu.search.space import apply_pins, concrete_sizes, default_plan
    from habu.target import TARGETS

    target, model = TARGETS[ARCH], case_model(case)
    plan = default_plan(model, target, case.sizes, pins.get("plan"))  # plan-wide pins (a rewrite) first
    model = apply_rewrites(model, plan.rewrites)  # the kernels' nodes are the rewritten model's
    regions = default_regions(model)
    kernels = list(plan.kernels)
    for i, k in enumerate(kernels):
        kp = pins.get(i, pins.get("*")) if isinstance(k, ContractionKernel) else None
        if not kp:
            continue
        if "mma" in kp:
            k = contraction_path(kp["mma"]).default(model, regions[i], target, concrete_sizes(model, case.sizes),
                                                    forced=True) or k
        k = apply_pins(model, k, {key: v for key, v in kp.items() if key != "mma"}, target)
        kernels[i] = replace(k, store="direct") if k.store == "tma" and "store" not in kp and not _tma_fits(
            model, k, target) else k
    return replace(plan, kernels=tuple(kernels))


def _tma_fits(model, kernel, target) -> bool:
    from habu.paths.contraction import tma_store_fits

    return tma_store_fits(model, kernel, target)


def describe(plan) -> str:
    """`wgmma 64x64x64 s13 k1 | rows` for each kernel."""
    parts = []
    for k in plan.kernels:
        if hasattr(k, "tile_m"):
            cluster = "c" if k.split_k > 1 and k.split_reduce == "cluster" else ""
            bk = f"x{k.tile_k}" if k.tile_k != 64 else ""  # (a k tile of several swizzle spans)
            bk += " B-ahead" if getattr(k, "b_ahead", False) else ""
            parts.append(f"{k.mma} {k.tile_m}x{k.tile_n}{bk} s{k.stages} k{k.split_k}{cluster}{' p' if k.persistent else ''}"
                         f"{' A:' + k.a_move if k.a_move not in ('tma',) else ''}")
        else:
            parts.append(k.kind)
    return " | ".join(parts)


def build_one(case: Case, variant: str, pins: Pins) -> dict:
    """In a worker process (no GPU needed): the plan, proven, emitted and compiled (through the cache)."""
    from habu.emit_cuda.runtime import CompiledModel
    from habu.paths.emit import emit
    from habu.prove import prove
    from habu.target import TARGETS

    began = time.time()
    try:
        model = case_model(case)
        plan = variant_plan(case, pins)
        proof = prove(model, plan, case.sizes, trials=1)
        if not proof.ok:
            why = [o.describe() + ": " + o.detail for o in proof.violations] or [proof.certificate.failure]  # type: ignore[union-attr]
            return {"plan": plan, "error": f"not proven: {why[0]}", "build_s": time.time() - began}
        emitted = emit(proof, TARGETS[ARCH])
        CompiledModel(model, emitted, arch=ARCH, check_indices=False).compile(ARCH)
        return {"plan": plan, "emitted": emitted, "build_s": time.time() - began}
    except Exception as exc:  # a variant that cannot be built is reported on its row
        return {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-1500:],
                "build_s": time.time() - began}


# ----------------------------------------------------------------------------- baselines (torch)


def baselines(case: Case, t: Any) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """Functions of one input set: what an expert writes in torch for the case (eager), the same
    function under torch.compile, and for GGEMM cuBLAS on rows gathered beforehand."""
    F = t.nn.functional
    if case.model == "GGEMM":
        has_out_dtype = _has_out_dtype(t)

        def eager(s):
            rows = s["A"][s["IX"].long()]
            return t.mm(rows, s["B"].t(), out_dtype=t.float32) if has_out_dtype else t.mm(rows, s["B"].t()).float()

        def cublas_pregathered(s):  # the rows are gathered once, outside the timed call
            rows, b = s["A"][s["IX"].long()].contiguous(), s["B"].t()
            return lambda: t.mm(rows, b, out_dtype=t.float32) if has_out_dtype else t.mm(rows, b)

        return {"eager": eager, "cublas": cublas_pregathered}
    if case.model == "FFN-SKIP":
        def eager(s):
            h = F.gelu(t.addmm(s["B1"], s["X"], s["W1"]))
            y = t.addmm(s["B2"], h, s["W2"]) + s["X"]
            return F.rms_norm(y, (y.shape[-1],), eps=1e-6)

        return {"eager": eager}
    if case.model == "RMSNORM-LINEAR":
        def eager(s):
            return F.rms_norm(s["X"], (s["X"].shape[-1],), eps=1e-6) @ s["W"]

        return {"eager": eager}
    raise ValueError(case.model)


def _has_out_dtype(t: Any) -> bool:
    try:
        a = t.ones(16, 16, dtype=t.bfloat16, device="cuda")
        t.mm(a, a, out_dtype=t.float32)
        return True
    except (TypeError, RuntimeError):
        return False


# ----------------------------------------------------------------------------- on the GPU


def check_and_time(case: Case, name: str, built: dict, sets: list, outs: list, ref: dict, t: Any) -> dict:
    """The exact check (where the model is integer-exact), the golden check, then the timing."""
    from habu.emit_cuda.runtime import CompiledModel
    from habu.timing.exact import kept_types
    from habu.timing.exact_gpu import ExactChecker
    from habu.timing.harness import compare, time_cuda, tolerance

    row: dict[str, Any] = {"case": case.name, "variant": name, "build_s": built.get("build_s")}
    if "plan" in built:
        row["plan"] = describe(built["plan"])
        row["kernels"] = built["plan"].to_json()["kernels"]
    if "error" in built:
        row["error"], row["trace"] = built["error"], built.get("trace")
        return row
    try:
        model = case_model(case)
        compiled = CompiledModel(model, built["emitted"], arch=ARCH, check_indices=False)
        full = {e.name: e.size for e in model.extents}
        exact = ExactChecker(model, full).check(compiled, kept_types(built["plan"]), timeout_s=30.0)
        row["exact"] = ("bit-exact" if exact.applicable else "exact n/a") if exact.ok else exact.summary
        if not exact.ok:
            row["error"] = f"exact check failed: {exact.reason()}"
            return row
        out_name = model.outputs[0].name
        got = compiled(**sets[0], **outs[0])
        got = got[out_name] if isinstance(got, dict) else got
        t.cuda.synchronize()
        golden = compare(got, ref[out_name], tolerance(model, dict(built["plan"].storage)))
        row["golden"] = {"rel_error": golden.rel_error, "unwritten": golden.unwritten, "ok": golden.ok}
        if not golden.ok:
            row["error"] = f"golden check failed: {row['golden']}"
            return row
        row["us"] = time_cuda(lambda i: compiled(**sets[i], **outs[i]), len(sets))["median_us"]
        # the input sets in turn, as the timing does: one set called again and again keeps weights of up to
        # the L2's size there (GGEMM 64x4096x4096's 33.6 MB of B: a kernel 12.5 µs against 14.6 cold)
        row["kernel_us"] = kernel_times(lambda i: compiled(**sets[i % len(sets)], **outs[i % len(sets)]), t)
        row["cluster_fit"] = cluster_fit(compiled, full)
    except Exception as exc:  # one failing variant must not hide the others
        row["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        row["trace"] = traceback.format_exc()[-1500:]
    return row


def kernel_times(call: Callable[[int], Any], t: Any, reps: int = 6) -> list[list]:
    """[kernel, µs per call] of the GPU kernels the calls call(0), call(1), ... launch (as torch.profiler
    lists them; CUPTI sees the driver API's launches); [] where the profiler is not available."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(reps):
                call(i)
            t.cuda.synchronize()
        rows = []
        for e in prof.key_averages():
            total = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
            if total:
                rows.append([e.key.rsplit("_", 1)[-1] if e.key.startswith("habu_") else e.key[:40], total / reps])
        return rows
    except Exception:  # a profiler missing or refused: the totals stand alone
        return []


def cluster_fit(compiled: Any, sizes: dict[str, int]) -> list[str]:
    """For each cluster kernel: its blocks against the blocks of the clusters the GPU runs at once
    (cuOccupancyMaxActiveClusters): a grid past them runs in two waves."""
    from habu.emit_cuda import driver

    out = []
    try:
        dev = driver.device(0)
        kernels = compiled.kernel_set.members[0][1].kernels
        for k, fn in zip(kernels, compiled._functions(0, dev), strict=True):
            if k.cluster > 1:
                fits = driver.resident_blocks(k, fn, k.dynamic_smem(sizes), dev)
                out.append(f"{k.name.rsplit('_', 1)[-1]}: {k.grid(sizes, fits)} blocks, clusters of {k.cluster}, "
                           f"{fits} at once")
    except Exception as exc:  # a diagnostic only
        out.append(f"(cluster occupancy not read: {type(exc).__name__}: {str(exc)[:80]})")
    return out


def time_baselines(case: Case, sets: list, ref: dict, fns: dict, compiled_fn: Any, t: Any) -> dict[str, Any]:
    """Each baseline golden-checked (a wrong wiring shows) and timed on the same input sets."""
    from habu.timing.harness import compare, time_cuda

    out: dict[str, Any] = {}
    calls: dict[str, Callable[[int], Any]] = {"eager": lambda i: fns["eager"](sets[i])}
    if compiled_fn is not None:
        calls["torch.compile"] = lambda i: compiled_fn(sets[i])
    if "cublas" in fns:
        prepared = [fns["cublas"](s) for s in sets]
        calls["cuBLAS pre-gathered"] = lambda i: prepared[i]()
    out_name = case_model(case).outputs[0].name
    for key, call in calls.items():
        try:
            golden = compare(call(0), ref[out_name], 3e-2)
            t.cuda.synchronize()
            if not golden.ok:
                out[key] = {"error": f"disagrees with the float64 reference: {golden.rel_error:.2e}"}
                continue
            out[key] = {"us": time_cuda(call, len(sets))["median_us"]}
        except Exception as exc:
            out[key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
    return out


def case_inputs(case: Case, t: Any) -> tuple[list, list, dict]:
    from habu.bench.gpu_bench import sets_for
    from habu.timing.harness import make_inputs, poisoned_outputs, reference

    model = case_model(case)
    sizes = {e.name: e.size for e in model.extents}
    one = make_inputs(model, sizes, 100)
    nbytes = sum(v.numel() * v.element_size() for v in one.values())
    sets = [one] + [make_inputs(model, sizes, 100 + i) for i in range(1, sets_for(nbytes))]
    outs = [poisoned_outputs(model, sizes) for _ in sets]
    return sets, outs, reference(model, sets[0], sizes)


def weight_bytes(case: Case) -> int:
    model = case_model(case)
    total = 0
    for name in case.weights:
        decl = model.tensor(name)
        n = 1
        for e in decl.extents:
            n *= model.extent(e).size  # type: ignore[operator]
        total += n * (decl.dtype.bits // 8 if decl.dtype else 4)
    return total


def run(cases: list[Case], compile_baselines: bool, workers: int) -> tuple[list[dict], dict, float]:
    import torch as t

    jobs: dict[tuple[str, str], Future] = {}
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"))
    for case in cases:
        for name, pins in {"default": {}, **case.variants}.items():
            jobs[(case.name, name)] = pool.submit(build_one, case, name, pins)
    copy = _copy_bandwidth()
    rows, base = [], {}
    for case in cases:  # torch's baselines (and torch.compile's tracing) while the pool builds
        sets, outs, ref = case_inputs(case, t)
        fns = baselines(case, t)
        compiled_fn = None
        if compile_baselines:
            try:
                compiled_fn = t.compile(fns["eager"])
                compiled_fn(sets[0])
                t.cuda.synchronize()
            except Exception as exc:
                base[(case.name, "torch.compile")] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                compiled_fn = None
        for key, value in time_baselines(case, sets, ref, fns, compiled_fn, t).items():
            base[(case.name, key)] = value
        for name in ("default", *case.variants):
            built = jobs[(case.name, name)].result()
            rows.append(check_and_time(case, name, built, sets, outs, ref, t))
        # each case's table as soon as it is timed: a run cut short keeps the cases it finished
        print(report([case], [r for r in rows if r["case"] == case.name], base, copy)[0], flush=True)
        del sets, outs
        t.cuda.empty_cache()
    pool.shutdown()
    return rows, base, copy


def _copy_bandwidth() -> float:
    from habu.timing.harness import copy_bandwidth

    return copy_bandwidth()


def report(cases: list[Case], rows: list[dict], base: dict, copy: float) -> tuple[str, bool]:
    """The table (last in the output) and whether every default was checked and timed."""
    lines = [f"# decode shapes: device copy now {copy / 1e12:.2f} TB/s; floor = weight bytes / {COPY_TBPS} TB/s"]
    ok = True
    for case in cases:
        wb = weight_bytes(case)
        floor = floor_us(wb)
        lines.append(f"\n## {case.name}: weights {wb / 1e6:.1f} MB, floor {floor:.1f} µs "
                     f"({floor_us(wb, copy / 1e12):.1f} µs at the copy measured now)")
        refs = {k: v["us"] for (c, k), v in base.items() if c == case.name and "us" in v}
        for (c, k), v in base.items():
            if c == case.name:
                shown = f"{v['us']:8.1f} µs {100 * floor / v['us']:5.1f}% of floor" if "us" in v else v["error"]
                lines.append(f"  {k:<34} {'':<44} {shown}")
        head = "".join(f" {'x ' + k:>14}" for k in refs)
        lines.append(f"  {'variant':<34} {'plan':<44} {'µs':>8} {'%floor':>7}{head}  check")
        for row in (r for r in rows if r["case"] == case.name):
            if "us" not in row:
                ok = ok and row["variant"] != "default"
                lines.append(f"  {row['variant']:<34} {row.get('plan', '-'):<44} FAILED: {row['error'][:160]}")
                continue
            ratios = "".join(f" {refs[k] / row['us']:14.2f}" for k in refs)
            check = f"{row['exact']}, rel {row['golden']['rel_error']:.1e}"
            lines.append(f"  {row['variant']:<34} {row['plan']:<44} {row['us']:8.1f} "
                         f"{100 * floor / row['us']:6.1f}%{ratios}  {check}")
            per_kernel = ", ".join(f"{k} {us:.1f}" for k, us in row.get("kernel_us", []))
            if per_kernel or row.get("cluster_fit"):
                lines.append(f"  {'':<34} kernels (µs, profiled): {per_kernel}  {'; '.join(row.get('cluster_fit', []))}")
    return "\n".join(lines), ok


def profile(spec: str) -> int:
    """Build CASE's VARIANT and call it three times on one input set (`ncu -k regex:... -c 1` then
    profiles one of its kernels without the checks' and baselines' launches around it)."""
    case_name, _, variant = spec.partition(":")
    case = next((c for c in CASES if c.name == case_name), None)
    if case is None or (variant != "default" and variant not in case.variants):
        print(f"error: no variant {spec!r} (cases: {', '.join(c.name for c in CASES)})", file=sys.stderr)
        return 1
    import torch as t

    from habu.emit_cuda.runtime import CompiledModel
    from habu.timing.harness import make_inputs, poisoned_outputs

    built = build_one(case, variant, case.variants.get(variant, {}))
    if "error" in built:
        print(f"error: {built['error']}", file=sys.stderr)
        return 1
    model = case_model(case)
    compiled = CompiledModel(model, built["emitted"], arch=ARCH, check_indices=False)
    sizes = {e.name: e.size for e in model.extents}
    inputs, outs = make_inputs(model, sizes, 1), poisoned_outputs(model, sizes)
    for _ in range(3):
        compiled(**inputs, **outs)
    t.cuda.synchronize()
    print(f"{spec}: {describe(built['plan'])}; kernels {[k.name for k in built['emitted'].kernels]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--only", help="comma-separated case names (or parts of them)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--variants", help="comma-separated parts of variant names: time only those (and the default)")
    ap.add_argument("--profile", metavar="CASE:VARIANT",
                    help="build one variant (or 'default') and call it 3 times, nothing else: for ncu")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    if args.profile:
        return profile(args.profile)
    cases = [c for c in CASES if not args.only or any(p in c.name for p in args.only.split(","))]
    if args.variants:
        cases = [select_variants(c, args.variants.split(",")) for c in cases]
    began = time.time()
    rows, base, copy = run(cases, not args.no_compile, args.workers)
    _, ok = report(cases, rows, base, copy)  # (each case's table was printed as it finished)
    if args.json:
        args.json.write_text(json.dumps({"copy_bytes_per_s": copy, "seconds": time.time() - began, "rows": rows,
                                         "baselines": {f"{c}:{k}": v for (c, k), v in base.items()}},
                                        indent=1, default=str))
    print(f"\n{time.time() - began:.0f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
