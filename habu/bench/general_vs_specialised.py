"""What a missing kernel family costs (issue 19): five models, one per family, each timed with its
specialised default plan and with the general family's plan (a thread per output element, each
reduction a loop: the fallback every model has), in the same run:

    python -m habu.bench.general_vs_specialised [--json OUT.json] [--models GGEMM,RMSNORM]

The models are examples/families.habu: a gathered GEMM at 1024³ (the contraction family), RMSNorm
(bf16) and softmax (f32) at 4096 × 4096 (rows), the bias gradient at 8192 × 4096 bf16 → f32 (columns)
and SwiGLU over 4 × 1024 × 4096 bf16 (map); the general family computes the softmax as its four nodes
(SOFTMAX-NODES: its one-node form nests the max inside the sum, #C² iterations an element). Each plan
is proven (rules and a finite-field trial) and built, then
checked before it is timed: first the exact check (habu.timing.exact: small-integer inputs, every
output element bit for bit against the exact reference, red zones around every buffer) where the
model is integer-exact (the GEMM, the bias gradient), then the float64 golden on fresh random inputs
with a NaN-poisoned output, for every model. Times are CUDA events, 5 warm-ups and the median of 30
calls on input sets rotated past the L2. The table prints both times in µs and general / specialised.
Self-checking: exits 1 if any check fails (that plan is then not timed).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from habu.plan.plan import GeneralKernel, Plan
from habu.spec.ir import Model

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "families.habu"
MODELS = ("GGEMM", "RMSNORM", "SOFTMAX", "BIAS-GRAD", "SWIGLU")
GENERAL_THREADS = 256


def general_plan(model: Model, specialised: Plan) -> Plan:
    """The general family's plan of the model: one general kernel per node (`GENERAL_THREADS` threads a
    block, the specialised plan's index width), the specialised plan's storage kept."""
    width = max(k.index_width for k in specialised.kernels)
    kernels = tuple(GeneralKernel(nodes=(eq.target,), threads=GENERAL_THREADS, index_width=width)
                    for eq in model.nodes)
    return replace(specialised, kernels=kernels)


# the model the general family computes in a model's stead: the same function as single nodes, where the
# one-node form would make a thread per element recompute an inner reduction for every term
GENERAL_FORM = {"SOFTMAX": "SOFTMAX-NODES"}


def plans(name: str, target: str) -> list[tuple[str, str, Model, Plan]]:
    """(family, model name, model, plan) of the specialised default plan and of the general plan."""
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    program = load_program(EXAMPLE)
    out = []
    for family, model_name in (("specialised", name), ("general", GENERAL_FORM.get(name, name))):
        model = program.models[model_name]
        plan = default_plan(model, TARGETS[target], {}, {})
        out.append((family, model_name, model, plan if family == "specialised" else general_plan(model, plan)))
    return out


def _bytes(model: Model, sizes: dict[str, int]) -> int:
    """The fewest bytes a kernel moves: every input read once, every output written once."""
    from habu.spec.dtypes import DTYPES

    total = 0
    for t in (*model.inputs, *model.outputs):
        n = 1
        for e in t.extents:
            n *= sizes[e]
        total += n * (DTYPES[t.dtype.name].bytes if t.dtype else 4)
    return total


def measure(name: str, family: str, plan: Plan, model_name: str | None = None) -> dict:
    """Build, check (exact where it applies, then the float64 golden) and time one plan of `model_name`
    (default: `name`)."""
    from habu.bench.gpu_bench import sets_for
    from habu.bench.run import build
    from habu.timing.exact import kept_types
    from habu.timing.exact_gpu import ExactChecker
    from habu.timing.harness import (
        compare,
        make_inputs,
        poisoned_outputs,
        reference,
        time_cuda,
        tolerance,
        torch,
    )

    t = torch()
    built = build(str(EXAMPLE), model_name or name, {}, plan=plan)
    full = built.sizes
    row: dict = {"model": name, "family": family, "model_form": model_name or name, "kernels": [k["kind"] for k in plan.to_json()["kernels"]],
                 "plan": plan.to_json()["kernels"], "bytes": _bytes(built.model, full)}
    exact = ExactChecker(built.model, full, seed=3).check(built.compiled, kept_types(plan))
    row["exact"] = exact.as_dict()
    if not exact.ok:
        return row
    nsets = sets_for(row["bytes"])
    sets = [make_inputs(built.model, full, 200 + i) for i in range(nsets)]
    outs = [poisoned_outputs(built.model, full) for _ in range(nsets)]
    ref = reference(built.model, sets[0], full)
    got = built.compiled(**sets[0], **outs[0])
    t.cuda.synchronize()
    results = got if isinstance(got, dict) else {built.model.outputs[0].name: got}
    tol = tolerance(built.model, dict(plan.storage))
    goldens = {k: compare(v, ref[k], tol) for k, v in results.items()}
    row["golden"] = {k: {"rel_error": g.rel_error, "unwritten": g.unwritten, "ok": g.ok} for k, g in goldens.items()}
    if not all(g.ok for g in goldens.values()):
        return row
    timed = time_cuda(lambda i: built.compiled(**sets[i], **outs[i]), nsets)
    row["us"], row["p20_p80_us"] = timed["median_us"], (timed["p20_us"], timed["p80_us"])
    return row


def checked(row: dict) -> bool:
    return "us" in row


def table(rows: list[dict]) -> str:
    """The printed table: per model, the specialised family's time, the general family's, the ratio."""
    lines = [f"{'model':<10} {'specialised':<13} {'µs':>9} {'GB/s':>6}   {'general µs':>11} {'GB/s':>6}   "
             f"{'general / specialised':>21}  checks"]
    by_model: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_model.setdefault(row["model"], {})[row["family"]] = row
    for model, pair in by_model.items():
        spec, gen = pair.get("specialised"), pair.get("general")
        cells = []
        for row in (spec, gen):
            if row is None or not checked(row):
                cells.append(("FAILED", "-"))
            else:
                cells.append((f"{row['us']:.1f}", f"{row['bytes'] / (row['us'] * 1e-6) / 1e9:.0f}"))
        ratio = f"{gen['us'] / spec['us']:.1f}x" if spec and gen and checked(spec) and checked(gen) else "-"
        kind = "+".join(spec["kernels"]) if spec else "-"
        notes = "; ".join(_check_note(r) for r in (spec, gen) if r is not None)
        lines.append(f"{model:<10} {kind:<13} {cells[0][0]:>9} {cells[0][1]:>6}   {cells[1][0]:>11} {cells[1][1]:>6}   "
                     f"{ratio:>21}  {notes}")
    return "\n".join(lines)


def _check_note(row: dict) -> str:
    exact = row.get("exact", {})
    if not exact.get("ok", False):
        return f"{row['family']}: exact check FAILED {exact.get('summary', '')} {exact.get('mismatch') or ''}"
    if "golden" in row and not all(g["ok"] for g in row["golden"].values()):
        return f"{row['family']}: golden FAILED {row['golden']}"
    worst = max((g["rel_error"] for g in row.get("golden", {}).values()), default=0.0)
    return f"{row['family']}: {'exact' if exact.get('applicable') else 'not int-exact'}, golden {worst:.0e}"


def main(argv: list[str] | None = None) -> int:
    from habu.bench.run import device_target

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write every number here")
    ap.add_argument("--models", default=",".join(MODELS), help="a comma-separated subset of " + ", ".join(MODELS))
    args = ap.parse_args(argv)
    target = device_target()
    rows = []
    for name in args.models.split(","):
        for family, model_name, _, plan in plans(name, target):
            rows.append(measure(name, family, plan, model_name))
    print(f"general vs specialised kernel families ({target}; examples/families.habu; µs: median of 30, CUDA events)")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0 if all(checked(r) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
