"""GGEMM's backward on the H200 (issue 21: ≥ 1.0× torch autograd of `A[IX] @ B.T` at 4096³), in one run:

    python -m habu.bench.ggemm_backward_speed [--sizes 4096,1024] [--json OUT.json] [--pin KEY=VALUE ...]

Habu: tests/data/ggemm_backward.habu's default plans (and any pins given): dA[IX[m] k]
+= Σ n dO[m n]·B[n k] (at 4096³ the plain wgmma product into an f32 intermediate, then the scatter-add
kernel, `scatter:dA`; at 1024³ the wgmma contraction with an f32 atomicAdd scatter epilogue; the split's
scatter kernel with 8 elements a thread, and moving 4-element vectors, timed beside it as "dA split-…"; dA
zeroed first, inside the timed call) and dB[n k] = Σ m dO[m n]·A[IX[m] k] (A's gathered rows staged k-major,
then wgmma with TMA; timed beside it as "dB gathered-…", `gather:dB`: A's rows gathered by a copy, scalar or
16-byte vectors, then wgmma on two m-major operands). The fastest dA and dB variants of the run are timed
again together, as one call: the backward's measured ratio. torch: the
backward of `A[IX] @ B.T` (bf16, requires_grad on A and B) by torch.autograd.grad with the forward's graph
retained: dG = dO @ B, dA = index_put_ (accumulate) of dG into zeros, dB = dOᵀ @ A[IX] (the gathered rows
saved by the forward).

Self-check first, at each size: integer inputs (|x| ≤ 3, IX with duplicates), so every sum is an exact
integer in f32: Habu's dA equals torch's float64 `index_add` bit for bit, Habu's dB equals the float64
product rounded once to bf16; torch's own gradients are checked against the same reference (its bf16 dA
within 1% in norm). Then each kernel's device time (torch's profiler), Habu's and torch's. Timing: CUDA events, 5 warm-ups, the median of 30 calls queued behind a GPU
sleep (habu.timing.harness.time_cuda), 2 input sets. Exit status 1 when a self-check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from habu.bench.kernel_times import kernel_device_times
from habu.bench.run import build
from habu.timing.harness import time_cuda, torch

PATH = Path(__file__).resolve().parents[2] / "tests" / "data" / "ggemm_backward.habu"
PINS: dict[str, str] = {}  # the default plans (the wgmma contractions on sm_90a)
# dA's plans timed in the same run: the product stored plainly in f32 then the general scatter-add kernel
# (`scatter:dA`, the default at 4096³; `--pin family=contraction` keeps the scatter epilogue, 385 µs in session 30)
DA_VARIANTS = {"split-e8v1": {"rewrite": "scatter:dA", "elements": "8", "vector": "1", "reverse": "false"},
               # the scatter kernel moving 4 consecutive f32 a thread (one red.global.add.v4.f32 each); `reverse`:
               # its blocks from the last piece (what the product wrote last may still be in the L2)
               "split-e8v4": {"rewrite": "scatter:dA", "vector": "4", "elements": "8", "reverse": "false"},
               "split-e8v4r": {"rewrite": "scatter:dA", "vector": "4", "elements": "8", "reverse": "true"},
               "split-e2v4r": {"rewrite": "scatter:dA", "vector": "4", "elements": "2", "reverse": "true"},
               # the product on 256 x 128 tiles (cuBLAS's dB tile here; Habu's default is 128 x 256)
               "split-e8v4r-t256": {"rewrite": "scatter:dA", "vector": "4", "elements": "8", "reverse": "true",
                                    "tile": "256x128x64"}}
# dB's plans: A's rows staged k-major, and gathered by a copy first (`gather:dB`, the default at 4096³)
DB_VARIANTS = {"staged": {"family": "contraction"},
               "gathered-e8v1": {"rewrite": "gather:dB", "elements": "8", "vector": "1"},
               # the copy moving 8 consecutive bf16 (16 bytes) a thread
               "gathered-e8v8": {"rewrite": "gather:dB", "vector": "8", "elements": "8"},
               "gathered-e2v8": {"rewrite": "gather:dB", "vector": "8", "elements": "2"},
               "gathered-e8v8-t256": {"rewrite": "gather:dB", "vector": "8", "elements": "8", "tile": "256x128x64"}}
SETS = 2


def _inputs(m: int, n: int, k: int, seed: int) -> dict[str, Any]:
    t = torch()
    g = t.Generator().manual_seed(seed)
    return {"dO": t.randint(-3, 4, (m, n), generator=g).bfloat16().cuda(),
            "A": t.randint(-3, 4, (m, k), generator=g).bfloat16().cuda(),
            "B": t.randint(-3, 4, (n, k), generator=g).bfloat16().cuda(),
            "IX": t.randint(0, m, (m,), generator=g).int().cuda()}  # duplicates: about 1/e of the rows unused


def run_size(size: int, pins: dict[str, str], plain: bool = False) -> dict[str, Any]:
    t = torch()
    m = n = k = size
    shape = {"M": m, "N": n, "K": k}
    da_built = build(str(PATH), "GGEMM-DA", shape, pins, check_indices=False)
    db_built = build(str(PATH), "GGEMM-DB", shape, pins, check_indices=False)
    row: dict[str, Any] = {"size": size, "plans": {"dA": _described(da_built.plan),
                                                   "dB": _described(db_built.plan)}}
    # dA's and dB's variants, whichever the default took
    da_variants = {name: build(str(PATH), "GGEMM-DA", shape, pins | extra, check_indices=False)
                   for name, extra in DA_VARIANTS.items()}
    db_variants = {name: build(str(PATH), "GGEMM-DB", shape, pins | extra, check_indices=False)
                   for name, extra in DB_VARIANTS.items()}
    for name, built in (*da_variants.items(), *db_variants.items()):
        row["plans"][f"{'dA' if name in da_variants else 'dB'} {name}"] = _described(built.plan)
    sets = [_inputs(m, n, k, 100 + i) for i in range(SETS)]
    da_out = [t.empty((m, k), dtype=t.float32, device="cuda") for _ in range(SETS)]
    db_out = [t.empty((n, k), dtype=t.bfloat16, device="cuda") for _ in range(SETS)]

    def habu(i: int) -> None:
        s = sets[i]
        da_out[i].zero_()
        da_built.compiled(dO=s["dO"], B=s["B"], dA=da_out[i], IX=s["IX"])
        db_built.compiled(dO=s["dO"], A=s["A"], IX=s["IX"], dB=db_out[i])

    graphs = []
    for s in sets:  # torch's forward, its graph kept for the timed backward calls
        a, b = s["A"].clone().requires_grad_(True), s["B"].clone().requires_grad_(True)
        graphs.append((a[s["IX"].long()] @ b.t(), a, b, s["dO"]))

    def torch_backward(i: int) -> tuple[Any, Any]:
        out, a, b, d_o = graphs[i]
        return t.autograd.grad(out, (a, b), d_o, retain_graph=True)

    # the self-check: exact integers everywhere
    s = sets[0]
    habu(0)
    t_da, t_db = torch_backward(0)
    t.cuda.synchronize()
    ix = s["IX"].long()
    da_ref = t.zeros((m, k), dtype=t.float64, device="cuda").index_add(0, ix, s["dO"].double() @ s["B"].double())
    db_ref = (s["dO"].double().t() @ s["A"].double()[ix]).bfloat16()
    checks = {"habu dA": bool(t.equal(da_out[0].double(), da_ref)), "habu dB": bool(t.equal(db_out[0], db_ref)),
              **{f"habu dA {name}": bool(t.equal(built.compiled(dO=s["dO"], B=s["B"], IX=s["IX"], dA=t.zeros(
                  (m, k), dtype=t.float32, device="cuda")).double(), da_ref)) for name, built in da_variants.items()},
              **{f"habu dB {name}": bool(t.equal(built.compiled(dO=s["dO"], A=s["A"], IX=s["IX"]), db_ref))
                 for name, built in db_variants.items()},
              # torch's dA is bf16 (A's type), accumulated by index_put_ in bf16: within its rounding
              "torch dA": bool(((t_da.double() - da_ref).norm() / da_ref.norm()).item() < 1e-2),
              "torch dB": bool(t.equal(t_db, db_ref))}
    row["checks"] = checks
    if not all(ok for name, ok in checks.items() if name.startswith("habu")):
        row["error"] = "self-check failed"
        return row
    row["habu"] = time_cuda(habu, SETS)
    row["torch"] = time_cuda(torch_backward, SETS)
    for name in ("habu", "torch"):
        row[name].pop("samples", None)
    row["ratio"] = row["torch"]["median_us"] / row["habu"]["median_us"]  # > 1: Habu faster
    flops = 2 * 2 * m * n * k
    row["habu_tflops"] = flops / (row["habu"]["median_us"] * 1e-6) / 1e12
    # the parts, each alone (the dA zeroing inside dA's time)
    row["habu_dA_us"] = time_cuda(lambda i: (da_out[i].zero_(), da_built.compiled(
        dO=sets[i]["dO"], B=sets[i]["B"], dA=da_out[i], IX=sets[i]["IX"])), SETS)["median_us"]
    for name, built in da_variants.items():
        row[f"habu_dA_{name}_us"] = time_cuda(lambda i, built=built: (da_out[i].zero_(), built.compiled(
            dO=sets[i]["dO"], B=sets[i]["B"], dA=da_out[i], IX=sets[i]["IX"])), SETS)["median_us"]
    row["habu_dB_us"] = time_cuda(lambda i: db_built.compiled(
        dO=sets[i]["dO"], A=sets[i]["A"], IX=sets[i]["IX"], dB=db_out[i]), SETS)["median_us"]
    for name, built in db_variants.items():
        row[f"habu_dB_{name}_us"] = time_cuda(lambda i, built=built: built.compiled(
            dO=sets[i]["dO"], A=sets[i]["A"], IX=sets[i]["IX"], dB=db_out[i]), SETS)["median_us"]
    # the whole backward again with the fastest dA and dB variant of this run, as one timed call (the ratio
    # measured, not added up)
    best_da = min(da_variants, key=lambda name: row[f"habu_dA_{name}_us"])
    best_db = min(db_variants, key=lambda name: row[f"habu_dB_{name}_us"])
    da_best, db_best = da_variants[best_da], db_variants[best_db]

    def habu_best(i: int) -> None:
        s = sets[i]
        da_out[i].zero_()
        da_best.compiled(dO=s["dO"], B=s["B"], dA=da_out[i], IX=s["IX"])
        db_best.compiled(dO=s["dO"], A=s["A"], IX=s["IX"], dB=db_out[i])

    row["best"] = {"dA": best_da, "dB": best_db, **time_cuda(habu_best, SETS)}
    row["best"].pop("samples", None)
    row["best_ratio"] = row["torch"]["median_us"] / row["best"]["median_us"]
    # the default plans with dB on a second stream (dA and dB are independent: dA's memory-bound scatter
    # may overlap dB's GEMM); what a caller can do, not torch autograd's order: reported apart, not as the ratio
    side = t.cuda.Stream()

    def habu_streams(i: int) -> None:
        s, main = sets[i], t.cuda.current_stream()
        side.wait_stream(main)
        da_out[i].zero_()
        da_built.compiled(dO=s["dO"], B=s["B"], dA=da_out[i], IX=s["IX"])
        with t.cuda.stream(side):
            db_built.compiled(dO=s["dO"], A=s["A"], IX=s["IX"], dB=db_out[i])
        main.wait_stream(side)

    habu_streams(1)
    t.cuda.synchronize()
    row["checks"]["habu dB on a second stream"] = bool(t.equal(db_out[1], (
        sets[1]["dO"].double().t() @ sets[1]["A"].double()[sets[1]["IX"].long()]).bfloat16()))
    row["two_streams_us"] = time_cuda(habu_streams, SETS)["median_us"]
    if plain:  # dA's product stored plainly (no scatter, no zeroing): what the scatter costs over it
        dg_built = build(str(PATH), "GGEMM-DG", shape, pins, check_indices=False)
        dg_out = [t.empty((m, k), dtype=t.float32, device="cuda") for _ in range(SETS)]
        row["plain_dG_us"] = time_cuda(lambda i: dg_built.compiled(dO=sets[i]["dO"], B=sets[i]["B"], dG=dg_out[i]),
                                       SETS)["median_us"]
        row["plans"]["dG"] = dg_built.plan.to_json()["kernels"]
    # each kernel's device time (the profiler's): staging pass, GEMMs, torch's index_put and memsets
    row["kernels_us"] = {"habu": kernel_device_times(lambda: habu(0)), "torch": kernel_device_times(lambda: torch_backward(0))}
    for name, built in db_variants.items():
        row["kernels_us"][f"habu dB {name}"] = kernel_device_times(lambda built=built: built.compiled(
            dO=sets[0]["dO"], A=sets[0]["A"], IX=sets[0]["IX"], dB=db_out[0]))
    for name, built in da_variants.items():
        row["kernels_us"][f"habu dA {name}"] = kernel_device_times(lambda built=built: (da_out[0].zero_(), built.compiled(
            dO=sets[0]["dO"], B=sets[0]["B"], dA=da_out[0], IX=sets[0]["IX"])))
    return row


def _described(plan: Any) -> dict[str, Any]:
    out = plan.to_json()
    return {"rewrites": out.get("rewrites") or [], "kernels": out["kernels"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="4096,1024")
    p.add_argument("--json", default=None)
    p.add_argument("--pin", action="append", default=[], help="more pins for both kernels (KEY=VALUE)")
    p.add_argument("--plain-product", action="store_true", help="also time dA's product stored plainly (GGEMM-DG)")
    args = p.parse_args(argv)
    pins = PINS | dict(x.split("=", 1) for x in args.pin)
    rows, failed = [], False
    for size in (int(x) for x in args.sizes.split(",")):
        row = run_size(size, pins, args.plain_product)
        rows.append(row)
        failed |= "error" in row
        if "error" in row:
            print(f"{size}³: {row['error']}: {row['checks']}", flush=True)
            continue
        plain = f"; dA's product stored plainly {row['plain_dG_us']:.1f}" if "plain_dG_us" in row else ""
        variants = ", ".join(f"{name} {row[f'habu_dA_{name}_us']:.1f}" for name in DA_VARIANTS)
        db_variants = ", ".join(f"{name} {row[f'habu_dB_{name}_us']:.1f}" for name in DB_VARIANTS)
        print(f"{size}³: Habu {row['habu']['median_us']:.1f} µs (dA {row['habu_dA_us']:.1f} [{variants}], dB "
              f"{row['habu_dB_us']:.1f} [{db_variants}]; {row['habu_tflops']:.0f} TFLOP/s"
              f"{plain}) vs torch autograd "
              f"{row['torch']['median_us']:.1f} µs: {row['ratio']:.2f}x; checks {row['checks']}", flush=True)
        best = row["best"]
        print(f"  best variants together (dA {best['dA']} + dB {best['dB']}, one timed call): {best['median_us']:.1f} µs, "
              f"{row['best_ratio']:.2f}x torch autograd", flush=True)
        print(f"  the defaults with dB on a second stream (not torch's order; {row['checks']['habu dB on a second stream']}): "
              f"{row['two_streams_us']:.1f} µs", flush=True)
        print(f"  plans: dA {row['plans']['dA']}\n         dB {row['plans']['dB']}", flush=True)
        for who, times in row["kernels_us"].items():
            print(f"  {who} kernels: " + "; ".join(f"{name[:60]} {us:.1f} µs" for name, us in times.items()), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
