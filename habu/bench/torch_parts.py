"""Where torch's time goes on a gathered GEMM: the gather alone, the cuBLAS matmul alone, and
`A[IX] @ B.T` whole, timed in one process on rotated inputs; and the whole with an f32 output (the
example's declared dtype), two ways: cuBLAS writing f32 itself (`torch.mm(..., out_dtype=float32)`,
the expert's call) and a bf16 result converted afterwards (`.float()`, what most users write). It says how much of the baseline a
fused gather can save at most, and what a target ratio against the baseline asks in TFLOP/s.

    python -m habu.bench.torch_parts --m 4096 --n 4096 --k 4096 --target-ratio 1.2 --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from habu.timing.harness import time_cuda, torch


def measure(m: int, n: int, k: int, sets: int = 4, reps: int = 50) -> dict[str, float]:
    t = torch()
    g = t.Generator(device="cuda").manual_seed(0)
    a = [t.randn(m, k, device="cuda", dtype=t.bfloat16, generator=g) for _ in range(sets)]
    b = [t.randn(n, k, device="cuda", dtype=t.bfloat16, generator=g) for _ in range(sets)]
    ix = [t.randint(0, m, (m,), device="cuda", generator=g) for _ in range(sets)]
    gathered = [x[i] for x, i in zip(a, ix, strict=True)]
    parts = {
        "gather_us": time_cuda(lambda s: a[s][ix[s]], sets, reps=reps)["median_us"],
        "matmul_us": time_cuda(lambda s: gathered[s] @ b[s].T, sets, reps=reps)["median_us"],
        "whole_us": time_cuda(lambda s: a[s][ix[s]] @ b[s].T, sets, reps=reps)["median_us"],
        "whole_cast_f32_us": time_cuda(lambda s: (a[s][ix[s]] @ b[s].T).float(), sets, reps=reps)["median_us"],
    }
    try:
        parts["whole_out_f32_us"] = time_cuda(lambda s: t.mm(a[s][ix[s]], b[s].T, out_dtype=t.float32), sets,
                                              reps=reps)["median_us"]
    except (TypeError, RuntimeError) as exc:  # torch before 2.8 has no out_dtype
        print(f"torch.mm(..., out_dtype=float32) is not available here: {exc}")
    flop = 2.0 * m * n * k
    parts["matmul_tflops"] = flop / parts["matmul_us"] / 1e6
    parts["whole_tflops"] = flop / parts["whole_us"] / 1e6
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--target-ratio", type=float, default=1.2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    parts = measure(args.m, args.n, args.k)
    need_us = parts["whole_us"] / args.target_ratio
    parts["target_ratio"] = args.target_ratio
    parts["target_us"] = need_us
    parts["target_tflops"] = 2.0 * args.m * args.n * args.k / need_us / 1e6
    print(f"{args.m}x{args.n}x{args.k} bf16: gather {parts['gather_us']:.1f} µs, matmul {parts['matmul_us']:.1f} µs "
          f"({parts['matmul_tflops']:.0f} TFLOP/s), A[IX] @ B.T {parts['whole_us']:.1f} µs, with an f32 output "
          f"{parts.get('whole_out_f32_us', float('nan')):.1f} µs (out_dtype) / {parts['whole_cast_f32_us']:.1f} µs (.float()); "
          f"{args.target_ratio}x that is {need_us:.1f} µs = {parts['target_tflops']:.0f} TFLOP/s")
    if args.json:
        args.json.write_text(json.dumps(parts, indent=2))


if __name__ == "__main__":
    main()
