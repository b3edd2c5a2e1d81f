"""The MoE down projection with its scatter-add combine alone (`Y[IX[r] d] += P[r] · Σ h A[r h] · W2[E[r] d h]`,
the second grouped kernel of the MoE default plan), at the example shapes, for each of several tiles of the
grouped wgmma loop, against torch in the same run:

    python -m habu.bench.moe_combine_speed [--models mixtral,deepseek,qwen3] [--tokens 4096] [--profile]

For each model (its experts, top-k, model width D as the columns, hidden width H as the k extent) and token
count: routed rows sorted by expert (uniform top-k, habu.bench.moe_speed.routing), A random bf16 rows, Y random
prior contents. Each plan (`PLANS`: the default tile and the other wgmma tiles of the search, `--pin`ned) is
built (rules + a finite-field trial), its output checked against a float64 torch reference (relative error
≤ 2e-2), then timed (habu.timing.harness.time_cuda, median of the repetitions); the baseline is
torch._grouped_mm with index_add_ (where this torch has it) and a torch loop over the experts. Prints µs,
TFLOP/s (2·R·D·H) and each plan's ratio to the best torch time; `--profile` adds the kernels' µs. Exits 1 if
a check fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from habu.bench.moe_speed import SHAPES, compile_all, kernel_times, rel_error, routing
from habu.timing.harness import time_cuda, torch

TOL = 2e-2
WGMMA = {"family": "grouped", "main_loop": "wgmma"}
# (label, pins): the default plan's tile, then the wgmma loop's other tiles (habu.paths.grouped.WGMMA_TILES)
# "plain": the same product and row factor stored per routed row (Z[r n] = P[r] · Σ …, f32, no
# scatter): what the scatter-add epilogue's atomics cost (the table's difference to "default")
PLANS: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("default", "COMBINE", {}),
    ("v4", "COMBINE", {**WGMMA, "store_vector": "4"}),  # the 4-wide epilogue: float4 atomic adds
    ("plain", "PLAIN", WGMMA),
    ("128x128s6", "COMBINE", {**WGMMA, "bn": "128", "stages": "6"}),
    ("64x256s4", "COMBINE", {**WGMMA, "bm": "64", "warps_m": "1", "bn": "256", "stages": "4"}),
    ("128x256s3", "COMBINE", {**WGMMA, "bn": "256", "stages": "3"}),
)

MODEL = """1..32768 EXTENT: #T
1..262144 EXTENT: #R
{experts} EXTENT: #G
{d} EXTENT: #N
{h} EXTENT: #K
bf16 TENSOR: A  ( #R #K )
bf16 TENSOR: W  ( #G #N #K )
f32  TENSOR: P  ( #R )
f32  TENSOR: Y  ( #T #N )
ITENSOR: IX ( #R #T )
GROUPS:  E  ( #R #G )
f32  TENSOR: Z  ( #R #N )
MODEL: COMBINE
   Y[IX[r] n] += P[r] · Σ k A[r k] · W[E[r] n k] ;
MODEL: PLAIN
   Z[r n] = P[r] · Σ k A[r k] · W[E[r] n k] ;
"""


def torch_combine(a, w, ix, p, offsets, y, dtype=None) -> Any:
    """Y += P[r] · A[r] · W[E[r]]ᵀ into Y[IX[r]], expert by expert (float64 with `dtype`: the reference)."""
    out = y.clone()
    bounds = [0, *offsets.tolist()]
    for g in range(len(bounds) - 1):
        lo, hi = bounds[g], bounds[g + 1]
        if lo == hi:
            continue
        xs, wg = (a[lo:hi], w[g]) if dtype is None else (a[lo:hi].to(dtype), w[g].to(dtype))
        z = xs @ wg.T
        out.index_add_(0, ix[lo:hi].long(), (p[lo:hi, None].to(z.dtype) * z).to(out.dtype))
    return out


def grouped_mm_combine(a, w, ix, p, offsets, y) -> Any:
    t = torch()
    z = t._grouped_mm(a, w.transpose(1, 2), offs=offsets)
    out = y.clone()
    out.index_add_(0, ix.long(), p[:, None] * z.float())
    return out


def measure(key: str, tokens: int, profile: bool, plans: tuple[str, ...] | None = None) -> tuple[list[dict], bool]:
    from habu.bench.run import build

    t = torch()
    shape = SHAPES[key]
    rows = tokens * shape.topk
    ix, e, p, offsets = routing(tokens, shape.topk, shape.experts, "uniform", seed=tokens)
    g = t.Generator(device="cuda").manual_seed(tokens)
    a = t.randn((rows, shape.h), generator=g, device="cuda").bfloat16()
    w = (t.randn((shape.experts, shape.d, shape.h), generator=g, device="cuda") * shape.h ** -0.5).bfloat16()
    y = t.randn((tokens, shape.d), generator=g, device="cuda")
    ref = torch_combine(a, w, ix, p, offsets, y.double(), dtype=t.float64)
    # the plain store's reference: each routed row's P[r] · A[r] · W[E[r]]ᵀ (a scatter into rows 0..R-1)
    rows_ix = t.arange(rows, device="cuda", dtype=t.int32)
    ref_plain = torch_combine(a, w, rows_ix, p, offsets, t.zeros((rows, shape.d), device="cuda", dtype=t.float64),
                              dtype=t.float64)
    flops = 2.0 * rows * shape.d * shape.h
    methods: dict[str, Any] = {"torch loop": lambda i: torch_combine(a, w, ix, p, offsets, y),
                               "torch._grouped_mm": lambda i: grouped_mm_combine(a, w, ix, p, offsets, y)}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "combine.habu"
        path.write_text(MODEL.format(experts=shape.experts, d=shape.d, h=shape.h))
        out: list[dict] = []
        compiled: list[Any] = []
        for label, model_name, pins in PLANS:
            if plans and label not in plans:
                continue
            try:
                # (a one-kernel plan checks at the full shape unless asked: the witness keeps every tile class)
                built = build(str(path), model_name, {"T": tokens, "R": rows}, pins, witness=True)
            except Exception as exc:  # recorded: the table says why this plan has no number
                out.append({"method": f"habu {label}", "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            k = built.plan.kernels[-1]
            compiled.append(built.compiled)
            if model_name == "PLAIN":
                methods[f"habu {label}"] = (lambda c: lambda i: c(A=a, W=w, P=p, E=e))(built.compiled)
            else:
                methods[f"habu {label}"] = (lambda c: lambda i: c(A=a, W=w, P=p, Y=y.clone(), IX=ix, E=e))(
                    built.compiled)
            out.append({"method": f"habu {label}", "plan": f"{k.main_loop} {k.bm}x{k.bn}x{k.bk} s{k.stages}"})
    from habu.bench.run import device_target

    compile_all(compiled, device_target())  # the plans' kernels on every core at once
    failed = False
    rows_out = {r["method"]: r for r in out}
    for name, fn in methods.items():
        row = rows_out.setdefault(name, {"method": name})
        try:
            got = fn(0)
            t.cuda.synchronize()
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            continue
        err = rel_error(got, ref_plain if name == "habu plain" else ref)
        if not err <= TOL:
            row["error"] = f"wrong: relative error {err:.2e}"
            failed |= name.startswith("habu")
            continue
        row["us"] = time_cuda(fn, 1, warmup=3, reps=20)["median_us"]
        row["tflops"] = flops / row["us"] / 1e6
        if profile and name != "torch loop":
            row["kernels"] = kernel_times(fn)[:4]
    return list(rows_out.values()), failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mixtral,deepseek,qwen3")
    ap.add_argument("--tokens", default="4096")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--plans", help="only these of the plans' labels, comma-separated (" +
                    ",".join(label for label, _, _ in PLANS) + ")")
    args = ap.parse_args(argv)
    plans = tuple(args.plans.split(",")) if args.plans else None
    failed = False
    for key in args.models.split(","):
        for tokens in (int(n) for n in args.tokens.split(",")):
            rows, bad = measure(key, tokens, args.profile, plans)
            failed |= bad
            best = min((r["us"] for r in rows if "us" in r and not r["method"].startswith("habu")), default=None)
            for r in rows:
                cell = (f"{r['us']:10.1f} µs {r['tflops']:6.0f} TFLOP/s" if "us" in r else r.get("error", "-")[:60])
                ratio = f"{best / r['us']:.2f}x" if best and "us" in r else ""
                print(f"{SHAPES[key].name:<15} {tokens:>6} {r['method']:<22} {r.get('plan', ''):<22} {cell} {ratio}")
                for kname, us in r.get("kernels", []):
                    print(f"    {us:10.1f} µs  {kname[:90]}")
            sys.stdout.flush()
            torch().cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
