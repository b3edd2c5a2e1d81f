"""Where a stored plan's time goes on the GPU: each of its kernels timed on its own (the device
time the CUDA profiler records for it), next to the whole plan and the search's torch baseline,
kernel by kernel too. Each kernel's own time is read with the plan's launches serialised (a kernel
launched early also counts the time it waits for the previous one). The plan is the best one the
database holds for the file's model.

    python -m habu.bench.kernel_times examples/rmsnorm_linear.habu --db plans.sqlite --json out.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def kernel_device_times(fn, reps: int = 20) -> dict[str, float]:
    """Mean device time (µs) per kernel name over `reps` calls of `fn`, from torch's profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time
    return {name: t / reps for name, t in sorted(total.items(), key=lambda kv: -kv[1])}


def device_timeline(fn, reps: int = 10) -> dict[str, object]:
    """Where the GPU sat idle during `reps` back-to-back calls of `fn` (queued behind a GPU sleep, as
    habu.timing.harness.time_cuda queues them): `timeline` of the kernels the profiler saw."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    sleep = getattr(torch.cuda, "_sleep", None)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        if sleep is not None:
            sleep(int(0.2 * 2.0e9))  # the calls queued while the GPU sleeps: no gap is the CPU's
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    spans = [(ev.time_range.start, ev.time_range.end, ev.name) for ev in prof.events()
             if ev.device_type == torch.autograd.DeviceType.CUDA]
    return timeline(spans, reps, behind_a_sleep=sleep is not None)


def timeline(spans: list[tuple[float, float, str]], reps: int, behind_a_sleep: bool) -> dict[str, object]:
    """Of kernels' (start, end, name) intervals over `reps` calls (the first, the GPU sleep they were queued
    behind, left out when `behind_a_sleep`: torch names it `spin_kernel`), per call: the span from the first
    kernel's start to the last one's end, the time some kernel ran (the union of the intervals), the idle
    time, and the idle time between each pair of kernels that meet with a gap, the widest pairs first (µs)."""
    spans = sorted(spans)[1:] if behind_a_sleep else sorted(spans)
    if not spans:
        return {}
    busy, gaps, reach, last = 0.0, [], spans[0][0], spans[0][2]
    for start, end, name in spans:
        if start > reach:
            gaps.append((start - reach, last, name))
        busy += max(0.0, end - max(start, reach))
        if end > reach:
            reach, last = end, name
    span = reach - spans[0][0]
    between: dict[tuple[str, str], float] = defaultdict(float)
    for gap, after, before in gaps:
        between[(after, before)] += gap
    widest = sorted(between.items(), key=lambda kv: -kv[1])[:8]
    return {"span_us": span / reps, "busy_us": busy / reps, "idle_us": (span - busy) / reps,
            "gaps": [{"us": round(g / reps, 1), "after": a[:60], "before": b[:60]} for (a, b), g in widest]}


@contextmanager
def serial_launches() -> Iterator[None]:
    """Within the block, each kernel of a plan starts after the previous one completed (no early launch), calls
    packed before it (a CompiledModel's `CallPlan`, built at the first call of a layout) included: before, those
    launched early still, and a kernel's profiled time counted its wait for the previous kernel (session 33: the
    4096-token step's forward rows kernel 184.8 µs behind its GEMM, a 14336-element copy 31.3 µs)."""
    from habu.emit_cuda import driver

    was = driver.serialised
    driver.serialised = True
    try:
        yield
    finally:
        driver.serialised = was


def main() -> None:
    from habu.bench.run import build
    from habu.db import PlanDB
    from habu.plan.plan import Plan
    from habu.spec.parser import load_program
    from habu.timing.baselines import torch_baseline
    from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    model = next(iter(load_program(Path(args.file)).models.values()))
    with PlanDB(args.db) as db:
        entry = next((e for e in db.entries() if e.records), None)
        if entry is None:
            raise SystemExit(f"{args.db}: no stored plan")
        plan = Plan.from_json(entry.records[0].plan)
    built = build(args.file, model.name, {}, plan=plan)
    s = built.sizes
    inputs, outs = make_inputs(model, s, 7), poisoned_outputs(model, s)
    whole = time_cuda(lambda i: built.compiled(**inputs, **outs), 1, reps=50)
    parts = kernel_device_times(lambda: built.compiled(**inputs, **outs))
    with serial_launches():
        serial = time_cuda(lambda i: built.compiled(**inputs, **outs), 1, reps=50)
        alone = kernel_device_times(lambda: built.compiled(**inputs, **outs))
    # a kernel launched early counts the time its blocks wait for the previous one: each kernel's own
    # time is read with the plan's launches serialised
    out = {"plan": plan.key, "whole_us": whole["median_us"], "whole_serial_us": serial["median_us"],
           "kernels_us": alone, "kernels_overlapped_us": parts}
    base = torch_baseline(built.model, inputs)
    if base is not None:
        text, fn = base
        out["torch"] = text
        out["torch_us"] = time_cuda(lambda i: fn(inputs), 1, reps=50)["median_us"]
        out["torch_kernels_us"] = kernel_device_times(lambda: fn(inputs))
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
