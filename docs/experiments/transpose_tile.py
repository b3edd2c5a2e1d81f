"""The transposing staging pass's tile (session 71): a (K, N) weight staged K-major (`W[d n]` of
examples/rmsnorm_linear.habu, W pinned staged) moves through shared memory in `TRANSPOSE_TILE`² tiles, 256 threads:
32 × 32 (the default: 64-byte runs loaded and stored) against 64 × 64 (128-byte runs, 16 elements a thread).
The plan is the same otherwise; each variant passes the exact check first. Times are medians of CUDA events over
input sets rotated past the L2 (`habu.timing.harness`), the whole plan (the pass and the product).

    python docs/experiments/transpose_tile.py"""
import sys

import habu.lower.staging as staging
from habu.bench.gpu_bench import sets_for
from habu.bench.run import build
from habu.timing.exact import kept_types
from habu.timing.exact_gpu import ExactChecker
from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda

SHAPES = ({"T": 2048, "D": 4096, "N": 4096}, {"T": 128, "D": 4096, "N": 14336})
PINS = {"W": "staged"}


def main() -> int:
    failed = 0
    for shape in SHAPES:
        for tile in (32, 64):
            staging.TRANSPOSE_TILE = tile
            staging.staged.cache_clear()
            built = build("examples/rmsnorm_linear.habu", "RMSNORM-LINEAR", shape, PINS)
            stages = [k.lowering for k in built.compiled.kernel_set.members[0][1].kernels if "stage" in k.name]
            assert stages and all(st.tile is not None and st.tile.across == tile for st in stages), stages
            exact = ExactChecker(built.model, built.sizes, seed=3).check(built.compiled, kept_types(built.plan))
            if not exact.ok:
                print(f"{shape} tile {tile}: EXACT FAILED {exact.reason()}")
                failed += 1
                continue
            per_set = 2 * (shape["T"] * shape["D"] + shape["D"] * shape["N"] + shape["T"] * shape["N"])
            n = sets_for(per_set)
            sets = [make_inputs(built.model, built.sizes, 40 + i) for i in range(n)]
            outs = [poisoned_outputs(built.model, built.sizes) for _ in range(n)]
            us = time_cuda(lambda i, b=built, s=sets, o=outs: b.compiled(**s[i], **o[i]), n)["median_us"]
            print(f"T {shape['T']:5d} D {shape['D']} N {shape['N']:5d}  tile {tile}x{tile}: {us:8.1f} us (the pass and "
                  f"the product); W is {2 * shape['D'] * shape['N'] / 1e6:.0f} MB")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
