"""The FFN-SKIP training step (habu.bench.train_step_speed) at the given tokens, then, from
the same build, each kernel of Habu's step timed alone (torch.profiler, launches serialised), with the nodes
each backward kernel computes (the default plan, as the build chose it). One build per token count.

    python -m habu.bench.train_step_profile --tokens 4096 --json OUT.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import habu.bench.backward_speed as backward_speed
import habu.bench.train_step_speed as ts


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--target", default="sm_90a")
    ap.add_argument("--pins", default="", help="both plans' pins, KEY=VALUE joined by commas (lag=2)")
    args = ap.parse_args()
    pins = dict(p.split("=", 1) for p in args.pins.split(",") if p.strip())
    import torch

    from habu.bench.kernel_times import device_timeline, kernel_device_times, serial_launches
    from habu.compile import bind_shape
    from habu.search.space import default_plan
    from habu.target import target_named
    from habu.timing.harness import time_cuda

    bw, fwd, back = built = backward_speed.build("ffn_skip.habu", "FFN-SKIP", {"B": args.tokens}, args.target, pins,
                                                 pins)
    print(ts.HEADER, flush=True)
    row = ts.measure(args.tokens, args.target, built)
    print(ts.table_line(row), flush=True)
    sizes = {"B": args.tokens, **ts.SIZES}
    for label, model in (("forward", bw.forward), ("backward", bw.model)):
        plan = default_plan(bind_shape(model, sizes), target_named(args.target), sizes, pins)
        print(f"{label} default plan: rewrites {plan.rewrites}", flush=True)
        for i, k in enumerate(plan.kernels):
            print(f"  k{i}: {k.kind} {' '.join(k.nodes)}", flush=True)
        row[f"{label} kernels"] = [f"{k.kind} {' '.join(k.nodes)}" for k in plan.kernels]
    tensors = ts.inputs_for(args.tokens, 100)
    dy = torch.randn((args.tokens, ts.SIZES["D"]), device="cuda").to(torch.bfloat16)
    # the step's time outside its kernels: launches serialised (no early launch) against the default, and the
    # GPU's idle time in a timeline of back-to-back steps, each side
    habu_step = lambda: ts.habu_step(bw, fwd, back, tensors, dy)  # noqa: E731
    compiled_block = torch.compile(ts.torch_block)
    steps = {"habu": habu_step, "eager": lambda: ts.grads(ts.torch_block, tensors, dy),
             "torch.compile": lambda: ts.grads(compiled_block, tensors, dy)}
    with serial_launches():
        row["habu serialised us"] = time_cuda(lambda i: habu_step(), 1)["median_us"]
    row["habu us, same set"] = time_cuda(lambda i: habu_step(), 1)["median_us"]
    print(f"Habu's step on one input set: {row['habu us, same set']:.1f} µs, launches serialised "
          f"{row['habu serialised us']:.1f}", flush=True)
    for label, step in steps.items():
        timeline = device_timeline(step)
        row[f"{label} timeline"] = timeline
        print(f"{label}: a step spans {timeline['span_us']:.1f} µs on the GPU, kernels running "
              f"{timeline['busy_us']:.1f}, idle {timeline['idle_us']:.1f}; widest gaps:", flush=True)
        for g in timeline["gaps"][:5]:
            print(f"  {g['us']:8.1f} µs a step  after {g['after']}  before {g['before']}", flush=True)
    with serial_launches():
        alone = kernel_device_times(habu_step)
    print(f"each kernel of Habu's step alone (µs, launches serialised), total {sum(alone.values()):.1f}:", flush=True)
    for name, us in alone.items():
        print(f"  {us:9.1f}  {name}", flush=True)
    row["kernels alone us"] = alone
    # the baselines' kernels in the same run (torch launches no kernel early: each one's own time): where the
    # step's gap to them is, products (cuBLAS) or the rest
    for label, block in (("eager", ts.torch_block), ("torch.compile", compiled_block)):
        times = kernel_device_times(lambda b=block: ts.grads(b, tensors, dy))
        gemm = sum(us for name, us in times.items() if is_product(name))
        print(f"each kernel of {label}'s step (µs), total {sum(times.values()):.1f}, products {gemm:.1f}:", flush=True)
        print(f"  the most a step whose products run at these kernels' pace can reach against {label}'s kernels "
              f"(everything else free): {ceiling_ratio(times):.2f}x", flush=True)
        for name, us in list(times.items())[:12]:
            print(f"  {us:9.1f}  {name[:100]}", flush=True)
        row[f"{label} kernels us"] = times
    # the step's figures again, last, where a log's tail keeps them (session 50's profiles lost them to `| tail`)
    print(ts.HEADER, flush=True)
    print(ts.table_line(row), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(row, indent=1))
    return 1 if "failed" in row else 0


def ceiling_ratio(times: dict[str, float]) -> float:
    """A baseline's kernel time over its products' alone: the ratio against that baseline of a step whose
    products are as fast as the baseline's and whose every other kernel takes no time (issue 21's 4096-token
    step: its products are nearly all of it, so a ratio goal above this one asks for faster products)."""
    gemm = sum(us for name, us in times.items() if is_product(name))
    return sum(times.values()) / gemm if gemm else float("inf")


def is_product(kernel_name: str) -> bool:
    """Whether a torch kernel is a matrix product (cuBLAS/CUTLASS GEMM kernels: `sm90_xmma_gemm_…`,
    `…cutlass…gemm…`, `nvjet_…`), by its name."""
    name = kernel_name.lower()
    return any(word in name for word in ("gemm", "nvjet", "xmma", "cutlass"))


if __name__ == "__main__":
    raise SystemExit(main())
