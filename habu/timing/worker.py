"""Timing candidates in a separate process, so that a kernel that faults or hangs costs only itself.

`GpuTimer` starts a worker (multiprocessing, spawn) that owns the GPU: it makes the inputs once
(fresh random data, never zeros), computes the float64 reference on a sample of output elements
(the edges and random rows/columns of every output), and for each plan it is sent it emits,
compiles and loads the kernels, runs the exact check (habu.timing.exact: small-integer inputs in
red-zoned buffers, every output element compared bit for bit, where the model is integer-exact),
runs them once on NaN-poisoned outputs, compares the sampled elements with dtype-aware
tolerances, and only then times them (CUDA events, warm-up, median over
rotated input sets). A CUDA fault poisons the worker's context: it reports and exits, and the next
plan starts a fresh worker. A plan that does not answer within the timeout is a hang: the worker is
killed and the plan recorded as failed.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Measurement:
    ok: bool
    reason: str = ""
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    samples_us: list[float] | None = None
    golden: dict | None = None
    resources: dict | None = None
    seconds: dict | None = None  # the timing worker's wall time per step (load, exact, check, time)
    exact: dict | None = None  # the exact check's verdict (habu.timing.exact.ExactResult.as_dict)


class GpuTimer:
    """A client for the timing worker of one model and shape."""

    def __init__(self, path: str, model: str, sizes: dict[str, int], timeout_s: float = 30.0, reps: int = 20,
                 seed: int = 0, source: str | None = None):
        from pathlib import Path

        text = source if source is not None else Path(path).read_text()
        self.args = (text, str(path), model, dict(sizes), reps, seed)
        self.timeout_s = timeout_s
        self.start_timeout_s = 180.0  # making the inputs and the sampled float64 reference
        self.proc: Any = None
        self.conn: Any = None
        self.info: dict | None = None
        self.unavailable = ""  # why the worker could not start, when it could not
        self.failed_starts = 0  # in a row: after `max_failed_starts`, plans fail at once
        self.max_failed_starts = 2

    def start(self) -> dict | None:
        """Start the worker; the GPU's description, or None when there is no usable GPU."""
        ctx = mp.get_context("spawn")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, *self.args), daemon=True)
        self.proc.start()
        child.close()
        self.conn = parent
        if not parent.poll(self.start_timeout_s):
            self.close()
            self.unavailable = (f"the timing worker was not ready after {self.start_timeout_s:.0f} s "
                                "(a kernel that hung may have wedged the GPU)")
            self.failed_starts += 1
            return None
        try:
            msg = parent.recv()
        except EOFError:
            msg = {"kind": "unavailable", "reason": "the timing worker died while starting"}
        if msg.get("kind") != "ready":
            self.close()
            self.info = None
            self.unavailable = msg.get("reason", "no GPU")
            self.failed_starts += 1
            return None
        self.failed_starts = 0
        self.info = msg["info"]
        return self.info

    def measure(self, plan_json: dict, cubins: list | None = None) -> Measurement:
        """Golden-check and time one plan; `cubins`: its kernels compiled elsewhere (else it
        compiles them here)."""
        if self.proc is None or not self.proc.is_alive():
            if self.failed_starts >= self.max_failed_starts:
                return Measurement(False, f"not timed: the timing worker failed to start {self.failed_starts} "
                                          f"times in a row (the last: {self.unavailable})")
            if self.start() is None:
                return Measurement(False, "the timing worker could not start: " + self.unavailable)
        assert self.conn is not None
        try:
            self.conn.send({"kind": "plan", "plan": plan_json, "cubins": cubins})
            if not self.conn.poll(self.timeout_s):
                self.close()
                return Measurement(False, f"timed out after {self.timeout_s:.0f} s (a hung kernel?); worker restarted")
            msg = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self.close()
            return Measurement(False, "the timing worker died (a kernel fault?); worker restarted")
        if msg.get("fatal"):
            self.close()
        return Measurement(**{k: v for k, v in msg.items() if k not in ("kind", "fatal")})

    def baseline(self) -> tuple[str, Measurement] | None:
        """The torch equivalent of the model timed like a plan (golden-checked too), or None."""
        if (self.proc is None or not self.proc.is_alive()) and self.start() is None:
            return None
        assert self.conn is not None
        try:
            self.conn.send({"kind": "baseline"})
            if not self.conn.poll(self.timeout_s):
                self.close()
                return None
            msg = self.conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError, OSError):
            self.close()
            return None
        if msg.get("kind") != "baseline":
            return None
        name = msg.pop("name") or "none"
        return name, Measurement(**{k: v for k, v in msg.items() if k not in ("kind", "fatal")})

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.conn.send({"kind": "stop"})
        if self.proc is not None:
            self.proc.join(timeout=2)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join(timeout=5)
        self.proc = self.conn = None


# ----------------------------------------------------------------------------- the worker


def sample_boxes(model, sizes: dict[str, int], rng: np.random.Generator, per_dim: int = 48) -> dict:
    """For every output: the first and last index and random ones along each dimension."""
    boxes = {}
    for t in model.outputs:
        dims = []
        for e in t.extents:
            n = sizes[e]
            pick = {0, n - 1} | set(rng.integers(0, n, size=min(n, per_dim)).tolist())
            dims.append(np.array(sorted(pick), dtype=np.int64))
        boxes[t.name] = tuple(dims)
    return boxes


def _die_with_parent() -> None:
    """Linux: this worker is killed when the process that started it dies (a Ray actor killed
    because it hung must not leave its worker holding the GPU)."""
    import ctypes
    import signal
    import sys

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _worker_main(conn: Any, source: str, path: str, model_name: str, sizes: dict[str, int], reps: int,
                 seed: int) -> None:
    _die_with_parent()
    try:
        from habu.gpu_info import device_info

        if device_info() is None:
            conn.send({"kind": "unavailable", "reason": "no CUDA device (cuInit/cuDeviceGetCount found none)"})
            return
        try:
            import torch
        except ImportError:
            conn.send({"kind": "unavailable", "reason": "the timing worker makes its GPU arrays with torch, "
                                                        "which is not installed (pip install torch)"})
            return
        if not torch.cuda.is_available():
            conn.send({"kind": "unavailable", "reason": "torch sees no CUDA device (a CPU-only torch build?)"})
            return
        from habu.emit_cuda.cache import prefill_cache
        from habu.emit_cuda.runtime import CompiledModel
        from habu.gpu_info import current_arch as device_target
        from habu.paths.emit import emit_plan
        from habu.plan.plan import Plan
        from habu.prove.demand import demand
        from habu.spec.evaluate import Evaluator
        from habu.spec.parser import parse_text
        from habu.spec.reference import Float64
        from habu.target import TARGETS
        from habu.timing.exact import kept_types
        from habu.timing.exact_gpu import ExactChecker
        from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda, tolerance

        target = TARGETS[device_target()]
        from habu.spec.grad_program import with_backward

        declared = with_backward(parse_text(source, path), model_name).models[model_name]
        model = declared.with_sizes(sizes)
        full = {e.name: e.size for e in model.extents}
        sets = [make_inputs(model, full, seed + i) for i in range(3)]
        outs = [poisoned_outputs(model, full) for _ in sets]
        # outputs that are inputs too (`+=`, scatter stores) are updated in place by every run: the
        # golden runs start from set 0's contents as drawn, which the reference was computed from
        prior = {t.name: sets[0][t.name].clone() for t in model.outputs if t.name in sets[0]}
        host = {k: (v.detach().cpu().double().numpy() if v.is_floating_point() else v.cpu().numpy())
                for k, v in sets[0].items()}
        boxes = sample_boxes(model, full, np.random.default_rng(seed))
        ref = Evaluator(model, full, Float64(), demand(model, boxes, full)).run(host)
        exact = ExactChecker(model, full, seed)
        exact.prepare()  # the witness and its exact reference, outside any plan's timeout
        info = dict(device_info() or {}) | {"torch": torch.__version__}
        conn.send({"kind": "ready", "info": info})
    except Exception as exc:  # no GPU, no torch, or the model does not build: say so once
        conn.send({"kind": "unavailable", "reason": f"{type(exc).__name__}: {exc}"})
        return
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg.get("kind") == "baseline":
            _restore(sets[0], prior)
            conn.send(_time_baseline(model, sets, ref, boxes, reps))
            continue
        if msg.get("kind") != "plan":
            return
        try:
            began = time.perf_counter()
            prefill_cache(msg.get("cubins"))
            plan = Plan.from_json(msg["plan"])
            # a size bucket's plan keeps its bucketed extents runtime ones (as habu.build emits it)
            ranged = {name for name, _, _ in plan.ranges}
            emit_model = declared.with_sizes({k: v for k, v in sizes.items() if k not in ranged}) if ranged else model
            emitted = emit_plan(emit_model, plan, target)
            compiled = CompiledModel(emit_model, emitted, arch=target.name, check_indices=False)
            loaded = time.perf_counter()
            verdict = exact.check(compiled, kept_types(plan))
            exact_done = time.perf_counter()
            if not verdict.ok:
                conn.send({"kind": "result", "ok": False, "reason": verdict.reason(), "exact": verdict.as_dict(),
                           "seconds": {"load": loaded - began, "exact": exact_done - loaded}})
                continue
            _restore(sets[0], prior)
            result = compiled(**sets[0], **outs[0])
            torch.cuda.synchronize()
            result = result if isinstance(result, dict) else {model.outputs[0].name: result}
            tol = tolerance(model, dict(plan.storage), plan.kernels)
            golden = _golden(result, ref, boxes, tol)
            checked = time.perf_counter()
            seconds = {"load": loaded - began, "exact": exact_done - loaded, "check": checked - exact_done}
            if not all(g["ok"] for g in golden.values()):
                conn.send({"kind": "result", "ok": False, "reason": f"wrong output: {golden}", "golden": golden,
                           "exact": verdict.as_dict(), "seconds": seconds})
                continue
            t = time_cuda(lambda i, run=compiled: run(**sets[i], **outs[i]), len(sets), warmup=3, reps=reps)
            seconds["time"] = time.perf_counter() - checked
            samples = t.pop("samples", None)
            conn.send({"kind": "result", "ok": True, **t, "samples_us": samples, "golden": golden,
                       "exact": verdict.as_dict(), "seconds": seconds})
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            fatal = ("CUDA_ERROR" in text or "illegal" in text.lower() or "cudaError" in text
                     or type(exc).__name__ == "ExactTimeout")  # a kernel still running holds the GPU
            conn.send({"kind": "result", "ok": False, "reason": text[:1500] + ("" if not fatal else
                       " (the GPU context is lost; the worker restarts)"), "fatal": fatal,
                       "golden": None})
            if fatal:
                return


def _golden(result: dict, ref: dict, boxes: dict, tol: float) -> dict:
    """Each output's sampled elements against the float64 reference: relative error, NaNs left."""
    from habu.spec.evaluate import BoxTensor
    from habu.timing.harness import relative_error

    golden = {}
    for name, out in result.items():
        picked = out.detach()
        for d, idx in enumerate(boxes[name]):  # only the sampled elements leave the GPU
            picked = picked.index_select(d, _torch_index(idx, picked.device))
        got = picked.double().cpu().numpy()
        expect = ref[name].data if isinstance(ref[name], BoxTensor) else ref[name][np.ix_(*boxes[name])]
        unwritten = int(np.isnan(got).sum())
        err = relative_error(got, expect)
        golden[name] = {"rel_error": err, "tol": tol, "unwritten": unwritten, "ok": unwritten == 0 and err <= tol}
    return golden


def _torch_index(idx: np.ndarray, device: Any) -> Any:
    import torch

    return torch.as_tensor(idx, dtype=torch.int64, device=device)


def _restore(inputs: dict, prior: dict) -> None:
    """Put back the drawn contents of the inputs that a run updates in place (an accumulate's or a
    scatter's target): the exact check, the timing loop and earlier plans' runs have added into them."""
    for name, value in prior.items():
        inputs[name].copy_(value)


def _time_baseline(model, sets: list, ref: dict, boxes: dict, reps: int) -> dict:
    import torch

    from habu.timing.baselines import torch_baseline
    from habu.timing.harness import time_cuda, tolerance

    try:
        found = torch_baseline(model, sets[0])
        if found is None:
            return {"kind": "baseline", "name": None, "ok": False, "reason": ""}
        name, fn = found
        out = fn(sets[0])
        torch.cuda.synchronize()
        # torch rounds a 16-bit matmul's result to the operands' dtype before it is converted to
        # the output's: judge it at that dtype's tolerance (the plan keeps fp32 and is judged tighter)
        operand_dtypes = {t.name: t.dtype.name for t in model.inputs if t.dtype and not t.is_index}
        golden = _golden({model.outputs[0].name: out}, ref, boxes, tolerance(model, operand_dtypes))
        t = time_cuda(lambda i: fn(sets[i]), len(sets), warmup=3, reps=reps)
        samples = t.pop("samples", None)
        ok = all(g["ok"] for g in golden.values())
        return {"kind": "baseline", "name": name, "ok": ok, **t, "samples_us": samples, "golden": golden,
                "reason": "" if ok else f"the baseline's output is off: {golden}"}
    except Exception as exc:
        return {"kind": "baseline", "name": "the torch baseline", "ok": False,
                "reason": f"{type(exc).__name__}: {exc}"}
