"""Tiny outputs over a trailing axis (issue 19): a few long rows reduced (`O[b] = Σ i X[b i]`), the row
family's kernel (one block per row: the default before) or the general family's (a reduction over two
trailing axes: one thread per output) against the column family's transposed column reduction (the
default now: the rows split over the grid), and torch in the same run:

    python -m habu.bench.tiny_rows_speed [--json OUT.json]

Each plan is built and golden-checked (fresh random inputs, a NaN-poisoned output, the float64
reference), then timed with CUDA events (the median of 30) on input sets rotated past the L2
(habu.bench.gpu_bench's `sets_for`), against `X.float().sum(-1)` (`amax`, `sum((-2, -1))`) on the same
sets. Self-checking: exits 1 if a golden fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from habu.bench.gpu_bench import sets_for
from habu.bench.run import build, device_target
from habu.paths import general, rows
from habu.plan.patterns import Region, row_local
from habu.plan.plan import Plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from habu.timing.harness import compare, make_inputs, poisoned_outputs, reference, time_cuda, tolerance, torch

# name: (model text, torch's reduction of X)
SHAPES: dict[str, tuple[str, str]] = {
    "4 x 1M f32 sum": ("4 EXTENT: #B  1048576 EXTENT: #I  f32 TENSOR: X ( #B #I )  f32 TENSOR: O ( #B )\n"
                       "MODEL: T  O[b] = Σ i X[b i] ;\n", "sum"),
    "1 x 4M bf16 sum": ("1 EXTENT: #B  4194304 EXTENT: #I  bf16 TENSOR: X ( #B #I )  f32 TENSOR: O ( #B )\n"
                        "MODEL: T  O[b] = Σ i X[b i] ;\n", "sum"),
    "16 x 256K f32 max": ("16 EXTENT: #B  262144 EXTENT: #I  f32 TENSOR: X ( #B #I )  f32 TENSOR: O ( #B )\n"
                          "MODEL: T  O[b] = max i X[b i] ;\n", "max"),
    "8 x 512 x 512 bf16 sum": ("8 EXTENT: #B  512 EXTENT: #I  512 EXTENT: #J  bf16 TENSOR: X ( #B #I #J )\n"
                               "f32 TENSOR: O ( #B )  MODEL: T  O[b] = Σ i j X[b i j] ;\n", "sum2"),
}


def torch_reduce(how: str):
    return {"sum": lambda x: x.float().sum(-1), "max": lambda x: x.amax(-1),
            "sum2": lambda x: x.float().sum((-2, -1))}[how]


def row_family_plan(path: str) -> Plan:
    """The plan the default took before: the row family's kernel of the one node (one block per row), or
    the general family's where the node is no row statistic (a reduction over two trailing axes)."""
    model = load_program(path).models["T"]
    target = TARGETS[device_target()]
    sizes = {e.name: e.size for e in model.extents}
    plan = default_plan(model, target, sizes)
    (eq,) = model.nodes
    region = Region("rows" if row_local(eq) else "general", (eq.target,))
    path_ = rows.PATH if row_local(eq) else general.PATH
    return replace(plan, kernels=(path_.default(model, region, target, sizes),))


def measure(path: str, plan: Plan | None = None) -> dict:
    t = torch()
    built = build(path, "T", {}, plan=plan)
    full = built.sizes
    x = built.model.tensor("X")
    elems = 1
    for e in x.extents:
        elems *= full[e]
    nbytes = elems * (2 if str(x.dtype) == "bf16" else 4)
    nsets = sets_for(nbytes)
    sets = [make_inputs(built.model, full, 100 + i) for i in range(nsets)]
    outs = [poisoned_outputs(built.model, full) for _ in range(nsets)]
    ref = reference(built.model, sets[0], full)
    got = built.compiled(**sets[0], **outs[0])
    t.cuda.synchronize()
    golden = compare(got, ref["O"], tolerance(built.model, dict(built.plan.storage)))
    row: dict = {"kernel": type(built.plan.kernels[0]).__name__, "bytes": nbytes,
                 "golden": {"rel_error": golden.rel_error, "unwritten": golden.unwritten, "ok": golden.ok}}
    if golden.ok:
        row["habu_us"] = time_cuda(lambda i: built.compiled(**sets[i], **outs[i]), nsets)["median_us"]
        row["sets"] = sets
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every number here")
    args = ap.parse_args(argv)
    failed, out = False, []
    print(f"{'shape':<24} {'before':<28} {'µs':>8} {'columns µs':>11} {'torch µs':>9}  speedup")
    with tempfile.TemporaryDirectory() as tmp:
        for name, (text, how) in SHAPES.items():
            path = Path(tmp) / "tiny.habu"
            path.write_text(text)
            default, columns = measure(str(path), row_family_plan(str(path))), measure(str(path))
            sets = columns.pop("sets", None) or default.get("sets")
            default.pop("sets", None)
            row = {"shape": name, "default": default, "columns": columns}
            if sets and "habu_us" in columns:
                fn = torch_reduce(how)
                xs = [s["X"] for s in sets]
                row["torch_us"] = time_cuda(lambda i, fn=fn, xs=xs: fn(xs[i]), len(xs))["median_us"]
            bad = [k for k in ("default", "columns") if "habu_us" not in row[k]]
            failed = failed or bool(bad)
            if bad:
                print(f"{name:<24} golden FAILED: {', '.join(bad)} {[row[k]['golden'] for k in bad]}")
            else:
                print(f"{name:<24} {default['kernel']:<28} {default['habu_us']:8.1f} {columns['habu_us']:11.1f} "
                      f"{row.get('torch_us', float('nan')):9.1f}  {default['habu_us'] / columns['habu_us']:.2f}x")
            out.append(row)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
