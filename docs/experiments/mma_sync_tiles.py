"""Which tile the mma.sync path's default should take for small products (session 71 noticed: at K = 511 below
2048², its 128 × 128 default left most SMs idle, 1.3–2× slower than torch). For square products from 128² to 2048²
at K = 511 (staged) and K = 4096 (16-byte cp.async), the default against narrower tiles, each with the split-K the
default's rule gives its tile count (`split_rule`), and torch in the same run. Session 73 ran it (H100): the
default now takes 64 × 64 tiles for short small products (habu/paths/mma_sync.py), and the 128 × 128 tile it took
before is a pinned row.

    python docs/experiments/mma_sync_tiles.py

Each plan passes the exact differential check first, then a golden check against torch in f32
(docs/experiments/batched_staged.py's `timed`: N(0,1) inputs rotated past the L2, medians of CUDA events)."""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])

from batched_staged import PLAIN, timed

from habu.bench.run import build
from habu.timing.exact import kept_types
from habu.timing.exact_gpu import ExactChecker

SIDES = (128, 256, 512, 1024, 2048)
KS = (511, 4096)
SMS = 132
TILES = {"128x128 w8": ("128x128x32", 8, 3), "64x64 w4": ("64x64x32", 4, 4), "64x128 w4": ("64x128x32", 4, 3), "128x64 w4": ("128x64x32", 4, 3),
         "64x64x64 w4": ("64x64x64", 4, 3)}


def split_rule(side: int, k: int, tile_m: int, tile_n: int, tile_k: int) -> int:
    """The default's split-K (habu/paths/contraction.py: while the tiles fill at most half the SMs per doubling
    and each split keeps 8 k tiles)."""
    tiles, k_tiles, split = -(-side // tile_m) * -(-side // tile_n), -(-k // tile_k), 1
    while tiles * split * 2 <= SMS and k_tiles >= 8 * split * 2:
        split *= 2
    return split


def main() -> int:
    text, spec = PLAIN
    failed = 0
    for k in KS:
        for side in SIDES:
            shape = {"M": side, "N": side, "K": k}
            path = f"/tmp/mma_sync_tiles_{side}_{k}.habu"
            with open(path, "w") as f:
                f.write("  ".join(f"{v} EXTENT: #{n}" for n, v in shape.items()) + "\n" + text)
            plans = {"default": {"mma": "mma.sync"}}
            for name, (tile, warps, stages) in TILES.items():
                tm, tn, tk = (int(x) for x in tile.split("x"))
                split = split_rule(side, k, tm, tn, tk)
                plans[f"{name} s{split}"] = {"mma": "mma.sync", "tile": tile, "warps": str(warps),
                                             "stages": str(stages), "split_k": str(split)}
                if split > 1:
                    plans[f"{name} s1"] = {**plans[f"{name} s{split}"], "split_k": "1"}
            row, ref = [f"{side:5d}² × {k:4d}"], 0.0
            for name, pins in plans.items():
                try:
                    built = build(path, "P", {}, pins)
                except Exception as err:  # a refused pin (registers, shared memory) is reported
                    row.append(f"{name}: refused {str(err)[:60]}")
                    continue
                kern = built.plan.kernels[0]
                exact = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
                rel, us, ref = timed(built, shape, spec) if exact.ok else (None, 0.0, ref)
                if rel is None:
                    row.append(f"{name}: FAILED {exact.reason() if not exact.ok else 'golden'}")
                    failed += 1
                    continue
                label = name if name != "default" else (f"default {kern.tile_m}x{kern.tile_n}x{kern.tile_k} "
                                                         f"w{kern.warps} s{kern.split_k}")
                row.append(f"{label} {us:6.1f}")
            row.append(f"torch {ref:6.1f} us")
            print(" | ".join(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
