"""Where staging pays on the mma.sync path (sm_80's): Triton #10927's K = 511, rows no 4-byte vector divides, at
products from 64² × 511 up (`habu.paths.mma_sync.STAGE_MIN_PRODUCTS`), square and skinny (decode). For each, the plan
staged (two passes, then 16-byte cp.async) against the same tile read in place (2-byte loads), and torch in the
same run; the default is printed with the side of the threshold it takes.

    python docs/experiments/stage_threshold.py

Each plan passes the exact differential check first, then a golden check against torch in f32
(docs/experiments/batched_staged.py's `timed`: N(0,1) inputs rotated past the L2, medians of CUDA events)."""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from batched_staged import PLAIN, timed

from habu.bench.run import build
from habu.paths.contraction import SKINNY_ROWS
from habu.paths.mma_sync import STAGE_MAX_STREAMED, STAGE_MIN_PRODUCTS
from habu.timing.exact import kept_types
from habu.timing.exact_gpu import ExactChecker

SIDES = (64, 128, 192, 256, 384, 512, 768, 1024, 2048)
SKINNY = ((1, 4096), (16, 4096), (128, 4096), (16, 14336))  # decode: (M, N), the weight B[n k] streamed
PLANS = {"staged": {"mma": "mma.sync", "A": "staged", "B": "staged"},
         "in place": {"mma": "mma.sync", "A": "ldg", "B": "ldg", "vector": "1"}}


def main() -> int:
    text, spec = PLAIN
    failed = 0
    for m, n in [(side, side) for side in SIDES] + list(SKINNY):
        shape = {"M": m, "N": n, "K": 511}
        path = f"/tmp/stage_threshold_{m}_{n}.habu"
        with open(path, "w") as f:
            f.write("  ".join(f"{v} EXTENT: #{k}" for k, v in shape.items()) + "\n" + text)
        products = m * n * 511
        row = [f"{m:5d} × {n:5d} × 511 ({products / 2**20:7.1f} × 2^20)"]
        for name, pins in PLANS.items():
            built = build(path, "P", {}, pins)
            exact = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
            rel, us, ref = timed(built, shape, spec) if exact.ok else (None, 0.0, 0.0)
            if rel is None:
                row.append(f"{name}: FAILED {exact.reason() if not exact.ok else 'golden'}")
                failed += 1
                continue
            row.append(f"{name} {us:7.1f} us")
        streamed = m <= SKINNY_ROWS and n * 511 >= STAGE_MAX_STREAMED
        staged = products >= STAGE_MIN_PRODUCTS and not streamed
        row.append(f"torch {ref:7.1f} us; default {'staged' if staged else 'in place'}")
        print(" | ".join(row))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
