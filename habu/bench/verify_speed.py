"""How fast the finite-field check is: the GGEMM at 4096³ with its default plan, and every example.

    python -m habu.bench.verify_speed [--trials 3] [--repeat 3] [--only attention]

Prints one line per case (median of the repeats) for docs/PERF.md. A script, not a timed test.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

from habu.prove.rules import obligations
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="Only the cases whose example file name holds this.")
    args = ap.parse_args()
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} ({os.cpu_count()} cores), {args.trials} trials, "
          f"median of {args.repeat}")
    cases = [("ggemm.habu", "GGEMM", None)] + [(p.name, m, None) for p in sorted(EXAMPLES.glob("*.habu"))
                                               for m in load_program(p).models if p.name != "ggemm.habu"]
    cases.insert(1, ("ggemm.habu", "GGEMM", {"K": 511}))
    cases.append(("attention.habu", "ATTENTION-GQA", {"I": 1000, "J": 4096}))  # the example's comment's shape
    for path, name, sizes in (c for c in cases if args.only in c[0]):
        model = load_program(EXAMPLES / path).models[name]
        runtime = {e.name: 4096 for e in model.extents if not e.is_static}  # a size for runtime extents
        sizes = (sizes or {}) | runtime or None
        if sizes:
            model = model.with_sizes(sizes)
        plan = default_plan(model, TARGETS["sm_90a"], sizes)
        t0 = time.perf_counter()
        obs = obligations(model, plan, sizes)
        z3_s = time.perf_counter() - t0
        times, cert = [], None
        for _ in range(args.repeat):
            cert = verify_plan(model, plan, sizes, trials=args.trials)
            times.append(cert.seconds)
        assert cert is not None and cert.passed, cert.failure if cert else ""
        shape = "x".join(str(v) for v in dict(plan.shape).values())
        at = " (witness " + ",".join(f"{k}={v}" for k, v in cert.witness.items() if dict(plan.shape).get(k) != v) + ")" \
            if cert.witness else ""
        print(f"{path:<20} {name:<15} {shape:<22} z3 {len(obs):3d} obligations {z3_s:5.2f} s   "
              f"finite field {statistics.median(times):5.2f} s{at}")


if __name__ == "__main__":
    main()
