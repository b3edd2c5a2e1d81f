"""The column reduction's speed (issue 19: 8192 × 14336 bf16 → f32 at ≥ 85% of copy bandwidth), against
torch in the same run:

    python -m habu.bench.columns_speed [--json OUT.json] [--variants]

The default plan of examples/bias_grad.habu at #N = 14336 (with --variants, a few pinned neighbours of
it too), and the general family's plan (the fallback) for comparison, are built and golden-checked
(fresh random inputs, a NaN-poisoned output, float64 reference), then timed with CUDA events (5 warm-ups, the median of 30) on input sets rotated past the
L2 (habu.bench.gpu_bench's `sets_for`), against `dY.float().sum(0)` and `dY.sum(0, dtype=torch.float32)`
on the same sets. Bytes moved: dY read once and G written once; GB/s and % of 4.22 TB/s (the H200's
measured copy) and of the copy measured now are printed. Self-checking: exits 1 if a golden fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from habu.bench.gpu_bench import sets_for
from habu.bench.run import build, device_target
from habu.plan.plan import GeneralKernel, Plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from habu.timing.harness import (
    compare,
    copy_bandwidth,
    make_inputs,
    poisoned_outputs,
    reference,
    time_cuda,
    tolerance,
    torch,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bias_grad.habu"
SIZES = {"R": 8192, "N": 14336}
COPY_TBPS = 4.22  # the H200's device-to-device copy (docs/PERF.md, 2026-11-30)
VARIANTS = {  # pinned neighbours of the default, for the search's space and the cost model's term
    "unroll 4": {"unroll": "4"},
    "512 threads": {"threads": "512"},
    "256 rows a split": {"rows_per_split": "256"},
}


def general_plan() -> Plan:
    """The general family's plan of the same model (a thread per column, the rows a loop): what the
    column family saves, next to it."""
    model = load_program(EXAMPLE).models["BIAS-GRAD"].with_sizes(SIZES)
    plan = default_plan(model, TARGETS[device_target()], SIZES)
    return replace(plan, kernels=(GeneralKernel(nodes=("G",), threads=256, index_width=32),))


def measure(name: str, pins: dict[str, str], baselines: bool, plan: Plan | None = None) -> dict:
    t = torch()
    built = build(str(EXAMPLE), "BIAS-GRAD", SIZES, pins, plan=plan)
    (kernel,) = built.plan.kernels
    full = built.sizes
    nbytes = full["R"] * full["N"] * 2 + full["N"] * 4
    nsets = sets_for(full["R"] * full["N"] * 2)
    sets = [make_inputs(built.model, full, 100 + i) for i in range(nsets)]
    outs = [poisoned_outputs(built.model, full) for _ in range(nsets)]
    ref = reference(built.model, sets[0], full)
    got = built.compiled(**sets[0], **outs[0])
    t.cuda.synchronize()
    golden = compare(got, ref["G"], tolerance(built.model, dict(built.plan.storage)))
    row: dict = {"case": name, "pins": pins, "plan": built.plan.to_json()["kernels"][0], "bytes": nbytes,
                 "golden": {"rel_error": golden.rel_error, "unwritten": golden.unwritten, "ok": golden.ok}}
    if not golden.ok:
        return row
    habu = time_cuda(lambda i: built.compiled(**sets[i], **outs[i]), nsets)
    row["habu_us"] = habu["median_us"]
    row["habu_p20_p80"] = (habu["p20_us"], habu["p80_us"])
    if baselines:
        dys = [s["dY"] for s in sets]
        for key, fn in (("torch_float_sum", lambda i: dys[i].float().sum(0)),
                        ("torch_sum_dtype", lambda i: dys[i].sum(0, dtype=t.float32))):
            ref_t = fn(0)
            t.cuda.synchronize()
            assert compare(ref_t, ref["G"], 1e-3).ok, f"{key} disagrees with the float64 reference"
            row[key + "_us"] = time_cuda(fn, nsets)["median_us"]
    row["kernel"] = {f: getattr(kernel, f, "-") for f in ("threads", "column_threads", "vector", "rows_per_split",
                                                          "unroll")}
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--variants", action="store_true", help="also time a few pinned neighbours of the default")
    args = ap.parse_args(argv)
    copy = copy_bandwidth()
    rows = [measure("default", {}, baselines=True)]
    if args.variants:
        rows += [measure(name, pins, baselines=False) for name, pins in VARIANTS.items()]
    rows.append(measure("general family", {}, baselines=False, plan=general_plan()))
    print(f"column reduction G[n] = Σ r dY[r n], dY {SIZES['R']}x{SIZES['N']} bf16 -> f32; device copy now "
          f"{copy / 1e12:.2f} TB/s")
    print(f"{'case':<24} {'plan':<44} {'µs':>8} {'GB/s':>7} {'% 4.22':>7} {'% copy':>7}  golden")
    failed = False
    for row in rows:
        k = row.get("kernel", row["plan"])
        plan = (f"{k.get('threads')}t/{k.get('column_threads', '-')}c v{k.get('vector', '-')} "
                f"S{k.get('rows_per_split', '-')} u{k.get('unroll', '-')}")
        if "habu_us" not in row:
            failed = True
            print(f"{row['case']:<24} {plan:<44} golden FAILED {row['golden']}")
            continue
        gbps = row["bytes"] / (row["habu_us"] * 1e-6) / 1e9
        row["gbps"], row["pct_4_22"], row["pct_copy"] = gbps, gbps / (COPY_TBPS * 1e3), gbps * 1e9 / copy
        print(f"{row['case']:<24} {plan:<44} {row['habu_us']:8.1f} {gbps:7.0f} {100 * row['pct_4_22']:6.1f}% "
              f"{100 * row['pct_copy']:6.1f}%  {row['golden']['rel_error']:.1e}")
    base = rows[0]
    for key, what in (("torch_float_sum_us", "dY.float().sum(0)"), ("torch_sum_dtype_us", "dY.sum(0, dtype=f32)")):
        if key in base:
            gbps = base["bytes"] / (base[key] * 1e-6) / 1e9
            print(f"{'torch ' + what:<69} {base[key]:8.1f} {gbps:7.0f} {gbps / (COPY_TBPS * 10):6.1f}%   "
                  f"habu default {base[key] / base['habu_us']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"copy_bytes_per_s": copy, "rows": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
