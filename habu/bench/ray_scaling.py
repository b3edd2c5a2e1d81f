"""How the distributed search scales with GPUs: the same search on a local Ray cluster given 1, then
2 (or more) of this machine's GPUs, each run with its own empty cubin cache and plan database, in
one session. Reports candidates timed per minute (over the whole run, and over the region tuning,
which is what extra GPUs speed up) and the winner of each run.

    python -m habu.bench.ray_scaling examples/moe_gather.habu --budget 150 --gpus 1,2 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def one_run(path: str, gpus: int, budget_s: float, seed: int) -> dict:
    import ray

    from habu.cluster.ray_pool import RayExecutor, connect, gpu_pools
    from habu.compile import bind_shape
    from habu.db import PlanDB
    from habu.search.loop import Budget, Search
    from habu.search.tasks import Job
    from habu.spec.parser import load_program
    from habu.target import target_named

    work = Path(tempfile.mkdtemp(prefix=f"habu-scaling-{gpus}gpu-"))
    env = {"HABU_CACHE": str(work / "cubins")}  # nothing compiled by an earlier run is reused
    os.environ.update(env)
    program = load_program(Path(path))
    model = next(iter(program.models.values()))
    bound = bind_shape(model, {})
    sizes = {e.name: e.size for e in bound.extents}
    started = time.monotonic()
    connect("local", num_gpus=gpus)  # the local raylet and its workers inherit HABU_CACHE
    try:
        executor = RayExecutor()
        pools, problems = gpu_pools(Job.of(path, bound, sizes, "sm_90a"))
        if len(pools) != 1 or len(pools[0].actors) != gpus:
            raise SystemExit(f"wanted one pool of {gpus} GPU(s), got {[len(p.actors) for p in pools]}: {problems}")
        pool = pools[0]
        measure_many = pool.measure_many

        def logged(plans):  # say which plans failed on the GPU, and why
            out = measure_many(plans)
            for (plan, _), m in zip(plans, out, strict=True):
                if not m.ok:
                    print(f"  [{gpus} GPU] failed: {m.reason[:300]} :: {json.dumps(plan['kernels'])[:600]}", flush=True)
            return out

        pool.measure_many = logged
        target = target_named(pool.info["arch"])
        job_ready = time.monotonic() - started
        with PlanDB(work / "plans.sqlite") as db:
            last = [0.0]

            def progress(st) -> None:
                if time.monotonic() - last[0] >= 10:
                    last[0] = time.monotonic()
                    print(f"  [{gpus} GPU] {st.elapsed:5.0f} s: {st.timed} timed, {st.verified} verified, "
                          f"{st.failed} failed, {st.pruned_rules} rule-pruned, best {st.best_us}", flush=True)

            print(f"[{gpus} GPU] ready after {job_ready:.1f} s: {len(pool.actors)} actor(s) on {pool.info['gpu']}, "
                  f"{executor.parallelism} CPUs", flush=True)
            search = Search(path, bound, target, sizes, db, Budget(budget_s, None), pool, seed=seed,
                            progress=progress, executor=executor)
            result = search.run()
    finally:
        ray.shutdown()
    st = result.stats
    # the tuning phase runs from the default plan's timing to the end of the run; the timeline's
    # stamps are per batch (a batch's plans share one), so counting between the first and last
    # stamp overstated the rate when the last batch landed early (1251/min for a 295/min run)
    first = min((e["t"] for e in result.timeline), default=None)
    span = st.elapsed - first if first is not None else 0.0
    steady = (st.timed - 1) / span * 60 if st.timed > 1 and span > 0 else None
    return {"gpus": gpus, "gpu": pool.info["gpu"], "cpus": int(executor.parallelism), "budget_s": budget_s,
            "startup_s": round(job_ready, 1), "elapsed_s": round(st.elapsed, 1), "timed": st.timed,
            "verified": st.verified, "failed": st.failed, "pruned_rules": st.pruned_rules,
            "timed_per_min": round(st.timed / st.elapsed * 60, 1),
            "tuning_timed_per_min": None if steady is None else round(steady, 1),
            "winner_us": st.best_us, "winner": result.best.key, "baseline_us": st.baseline_us,
            "spent_s": {k: round(v, 2) for k, v in sorted(st.spent.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file")
    ap.add_argument("--budget", type=float, default=150.0, help="seconds per run")
    ap.add_argument("--gpus", default="1,2", help="GPU counts to run, in order")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    runs = []
    for n in (int(x) for x in args.gpus.split(",")):
        r = one_run(args.file, n, args.budget, args.seed)
        runs.append(r)
        print(json.dumps(r), flush=True)
        if args.json:
            args.json.write_text(json.dumps(runs, indent=2))
    base = runs[0]
    for r in runs[1:]:
        for k in ("timed_per_min", "tuning_timed_per_min"):
            if r[k] and base[k]:
                r[f"{k}_ratio"] = round(r[k] / base[k], 2)
        print(f"{r['gpus']} GPUs vs {base['gpus']}: timed/min {r['timed_per_min']} vs {base['timed_per_min']} "
              f"({r.get('timed_per_min_ratio')}x); tuning phase {r['tuning_timed_per_min']} vs "
              f"{base['tuning_timed_per_min']} ({r.get('tuning_timed_per_min_ratio')}x)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
