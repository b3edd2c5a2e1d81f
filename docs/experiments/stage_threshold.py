"""Where staging pays on the mma.sync path (sm_80's): Triton #10927's K = 511, rows no 4-byte vector divides, at
products around `habu.paths.mma_sync.STAGE_MIN_PRODUCTS` (2^28 multiply-adds). For each square M = N, the plan
staged (two passes, then 16-byte cp.async) against the same tile read in place (2-byte loads), and torch in the
same run; the default is printed with the side of the threshold it takes.

    python docs/experiments/stage_threshold.py

Each plan passes the exact differential check first, then a golden check against torch in f32
(docs/experiments/batched_staged.py's `timed`: N(0,1) inputs rotated past the L2, medians of CUDA events)."""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from batched_staged import PLAIN, timed

from habu.bench.run import build
from habu.paths.mma_sync import STAGE_MIN_PRODUCTS
from habu.timing.exact import kept_types
from habu.timing.exact_gpu import ExactChecker

SIDES = (256, 384, 512, 768, 1024, 2048)
PLANS = {"staged": {"mma": "mma.sync", "A": "staged", "B": "staged"},
         "in place": {"mma": "mma.sync", "A": "ldg", "B": "ldg", "vector": "1"}}


def main() -> int:
    text, spec = PLAIN
    failed = 0
    for side in SIDES:
        shape = {"M": side, "N": side, "K": 511}
        path = f"/tmp/stage_threshold_{side}.habu"
        with open(path, "w") as f:
            f.write("  ".join(f"{v} EXTENT: #{k}" for k, v in shape.items()) + "\n" + text)
        products = side * side * 511
        row = [f"{side:5d}² × 511 ({products / 2**28:5.2f} × 2^28)"]
        for name, pins in PLANS.items():
            built = build(path, "P", {}, pins)
            exact = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
            rel, us, ref = timed(built, shape, spec) if exact.ok else (None, 0.0, 0.0)
            if rel is None:
                row.append(f"{name}: FAILED {exact.reason() if not exact.ok else 'golden'}")
                failed += 1
                continue
            row.append(f"{name} {us:7.1f} us")
        row.append(f"torch {ref:7.1f} us; default {'staged' if products >= STAGE_MIN_PRODUCTS else 'in place'}")
        print(" | ".join(row))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
