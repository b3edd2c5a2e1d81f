"""Does a rewrite pay on the GPU? Every rewrite set of a model at its default plan (greedy fusion,
analytic schedule), each golden-checked against float64 on fresh inputs, then timed in one process
against the search's torch baseline (`habu.timing.baselines`).

    python -m habu.bench.rewrite_bench examples/rmsnorm_linear.habu --json out.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    from habu.bench.run import build, device_target
    from habu.plan.rewrite import apply_rewrites, rewrite_sets
    from habu.search.space import concrete_sizes, default_kernels, make_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from habu.timing.baselines import torch_baseline
    from habu.timing.harness import compare, make_inputs, poisoned_outputs, reference, time_cuda, tolerance

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    target = TARGETS[device_target()]
    model = next(iter(load_program(Path(args.file)).models.values()))
    s = concrete_sizes(model)
    sets = [make_inputs(model, s, seed) for seed in range(3)]
    rows = []
    for rw in rewrite_sets(model):
        graph = apply_rewrites(model, rw)
        plan = make_plan(model, target, default_kernels(graph, target, s), s, rw)
        built = build(args.file, model.name, {}, plan=plan)
        fresh = make_inputs(model, s, 100)
        outs = poisoned_outputs(model, s)
        ref = reference(model, fresh, s)
        result = built.compiled(**fresh, **outs)
        out_name = model.outputs[0].name
        got = result[out_name] if isinstance(result, dict) else result
        g = compare(got, ref[out_name], tolerance(model, dict(plan.storage)))
        outs_sets = [poisoned_outputs(model, s) for _ in sets]
        t = time_cuda(lambda i, c=built.compiled, o=outs_sets: c(**sets[i], **o[i]), len(sets), reps=50)
        rows.append({"rewrites": list(rw), "kernels": [k.kind for k in plan.kernels], "plan": plan.key,
                     "median_us": t["median_us"], "p20_us": t["p20_us"], "p80_us": t["p80_us"],
                     "golden_rel_error": g.rel_error, "golden_ok": g.ok})
    baseline = None
    found = torch_baseline(model, sets[0])
    if found is not None:
        name, fn = found
        base = time_cuda(lambda i: fn(sets[i]), len(sets), reps=50)
        baseline = {"name": name, "median_us": base["median_us"]}
        for r in rows:
            r["vs_baseline"] = base["median_us"] / r["median_us"]
    for r in rows:
        print(f"{'+'.join(r['rewrites']) or 'as written':12s} {'/'.join(r['kernels']):24s} {r['median_us']:8.1f} µs "
              f"[{r['p20_us']:.1f}–{r['p80_us']:.1f}] golden {r['golden_rel_error']:.1e} "
              f"{'ok' if r['golden_ok'] else 'WRONG'}" + (f"  {r['vs_baseline']:.2f}× torch" if baseline else ""))
    if baseline:
        print(f"baseline: {baseline['name']} {baseline['median_us']:.1f} µs")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "baseline": baseline}, indent=2))


if __name__ == "__main__":
    main()
