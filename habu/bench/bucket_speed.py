"""A runtime width compiled to size buckets against builds for one fixed width (issue 20 §4: within 5%
at every width), RMSNorm over 8192 rows in the same run:

    python -m habu.bench.bucket_speed [--json OUT.json] [--widths 768,4096,...] [--rows 8192]

One build (as `habu.build` makes it) of examples/rmsnorm.habu RMSNORM-ROWS with #D left at run time (the bucketed kernel
set, habu/plan/buckets.py) is called at every width; for each width a build with #D fixed to it is
timed beside it, and `F.rms_norm` too. Every build is golden-checked first at each width (fresh
random inputs, a NaN-poisoned output every element of which must be written, the float64 reference of
the first 512 rows); then each is timed with CUDA events
(5 warm-ups, the median of 30) on input sets rotated past the L2. Bytes moved: X read once and Y
written once; % of the copy bandwidth measured in the same run. The bucketed call goes through the
whole per-call path (argument checks, the bucket lookup, the launch), the fixed one through the same
path without buckets. Prints a table last; exits 1 if a golden fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from habu.bench.gpu_bench import sets_for
from habu.bench.run import device_target
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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rmsnorm.habu"
MODEL = "RMSNORM-ROWS"
WIDTHS = (768, 1024, 2048, 4096, 5120, 12288, 16384, 32768, 65536)


def build(shape: dict[str, int]):
    """The kernel set `habu.build` makes of RMSNORM-ROWS at `shape` (#D left out: the bucketed set)."""
    from habu.compile import compile_model, kernel_set
    from habu.emit_cuda.runtime import CompiledModel
    from habu.paths.emit import emit
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    target = TARGETS[device_target()]
    compiled = compile_model(load_program(EXAMPLE), MODEL, shape, target, {}, trials=1)
    members = [emit(p, target) for p in compiled.proofs]
    return CompiledModel(compiled.model, kernel_set(compiled, members), arch=target.name)


def measure(width: int, rows: int, bucketed, copy_bps: float) -> dict:
    """The fixed-width build, the bucketed build and torch at one width: golden, then times."""
    t = torch()
    fixed = build({"R": rows, "D": width})
    model = fixed.model
    sizes = {"R": rows, "D": width}
    nbytes = 2 * rows * width * 2
    nsets = sets_for(nbytes)
    sets = [make_inputs(model, sizes, 100 + i) for i in range(nsets)]
    outs = [poisoned_outputs(model, sizes) for _ in range(nsets)]
    # rows are independent: the float64 reference of the first rows, and every row written (no NaN left)
    checked = min(rows, 512)
    part = {"R": checked, "D": width}
    ref = reference(model.with_sizes(part), {"X": sets[0]["X"][:checked]}, part)["Y"]
    tol = tolerance(model, {})
    member = bucketed.kernel_set.index(sizes)
    row: dict = {"width": width, "bucket": member, "bytes": nbytes,
                 "bucket_kernel": bucketed.kernel_set.members[member][1].kernels[0].name,
                 "fixed_kernel": fixed.kernel_set.members[0][1].kernels[0].name}
    for name, built in (("fixed", fixed), ("bucketed", bucketed)):
        out = built(**sets[0], **poisoned_outputs(model, sizes))
        t.cuda.synchronize()
        g = compare(out[:checked], ref, tol)
        unwritten = int(t.isnan(out).sum().item())
        row[f"{name}_golden"] = {"rel_error": g.rel_error, "unwritten": unwritten, "ok": g.ok and unwritten == 0}
    if not (row["fixed_golden"]["ok"] and row["bucketed_golden"]["ok"]):
        return row
    xs = [s["X"] for s in sets]
    ys = [o["Y"] for o in outs]
    timed = {
        "fixed": lambda i: fixed(X=xs[i], Y=ys[i]),
        "bucketed": lambda i: bucketed(X=xs[i], Y=ys[i]),
        "torch": lambda i: t.nn.functional.rms_norm(xs[i], (width,), eps=1e-6),
    }
    for name, fn in timed.items():
        r = time_cuda(fn, nsets)
        row[f"{name}_us"] = r["median_us"]
        row[f"{name}_p20_p80"] = (r["p20_us"], r["p80_us"])
        row[f"{name}_copy_pct"] = 100.0 * nbytes / (r["median_us"] * 1e-6) / copy_bps
    # the fixed build timed a second time: the run's spread, against which a difference is read
    row["fixed_again_us"] = time_cuda(timed["fixed"], nsets)["median_us"]
    row["bucketed_over_fixed"] = row["bucketed_us"] / row["fixed_us"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write every row (times, goldens, kernels) here")
    ap.add_argument("--widths", default=",".join(map(str, WIDTHS)), help="comma-separated widths (multiples of 256)")
    ap.add_argument("--rows", type=int, default=8192)
    args = ap.parse_args()
    widths = [int(w) for w in args.widths.split(",") if w]
    copy_bps = copy_bandwidth()
    bucketed = build({"R": args.rows})  # #D at run time: the bucketed set
    rows = [measure(w, args.rows, bucketed, copy_bps) for w in widths]
    if args.json:
        args.json.write_text(json.dumps({"copy_GBps": copy_bps / 1e9, "rows": rows}, indent=1))
    print(f"\nRMSNorm {args.rows} rows, bf16; copy {copy_bps / 1e12:.2f} TB/s measured now")
    print(f"{'width':>6} {'bucket':>6} {'fixed µs':>9} {'again':>7} {'bucketed µs':>11} {'ratio':>6} "
          f"{'fixed %copy':>11} {'bucketed %copy':>14} {'torch µs':>9}")
    failed = False
    for r in rows:
        if "bucketed_us" not in r:
            failed = True
            print(f"{r['width']:>6} golden FAILED: fixed {r['fixed_golden']}, bucketed {r['bucketed_golden']}")
            continue
        print(f"{r['width']:>6} {r['bucket']:>6} {r['fixed_us']:>9.1f} {r['fixed_again_us']:>7.1f} "
              f"{r['bucketed_us']:>11.1f} {r['bucketed_over_fixed']:>6.3f} {r['fixed_copy_pct']:>10.0f}% "
              f"{r['bucketed_copy_pct']:>13.0f}% {r['torch_us']:>9.1f}")
    worst = max((r["bucketed_over_fixed"] for r in rows if "bucketed_us" in r), default=float("nan"))
    print(f"worst bucketed/fixed: {worst:.3f} (goal: at most 1.05)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
