"""A batched product whose operands' innermost index is the batch axis (`Y[s m n] = Σ k A[m k s]·B[n k s]`,
s batched; session 68's fuzz): the SIMT plan it had against the mma.sync plan (an element at a time into
m-major shared tiles) that session 69 made its default, and torch.einsum, in the same run.

    python docs/experiments/batch_innermost.py

Each plan passes the exact differential check first (small integers, red zones), then a golden check against
torch in float32 on N(0,1) inputs; times are medians of CUDA events over input sets rotated past the L2."""
import sys

from habu.bench.gpu_bench import sets_for
from habu.bench.run import build
from habu.timing.exact import kept_types
from habu.timing.exact_gpu import ExactChecker
from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda, torch

SHAPES = ({"M": 512, "N": 512, "K": 256, "S": 16}, {"M": 2048, "N": 256, "K": 128, "S": 8})
TEXT = ("bf16 TENSOR: A ( #M #K #S )  bf16 TENSOR: B ( #N #K #S )  f32 TENSOR: Y ( #S #M #N )\n"
        "MODEL: INNER  Y[s m n] = Σ k A[m k s] · B[n k s] ;\n")
PLANS = {"default": {}, "simt": {"mma": "fma"}, "mma.sync 64x64": {"mma": "mma.sync", "tile": "64x64x32"}}


def timed(built, shape: dict[str, int]) -> tuple[float | None, float, float]:
    """(the golden check's relative error, or None where it failed; Habu's µs; torch.einsum's µs)."""
    t = torch()
    per_set = 2 * (shape["M"] + shape["N"]) * shape["K"] * shape["S"] + 4 * shape["S"] * shape["M"] * shape["N"]
    n = sets_for(per_set)
    sets = [make_inputs(built.model, built.sizes, 300 + i) for i in range(n)]
    outs = [poisoned_outputs(built.model, built.sizes) for _ in range(n)]
    got = built.compiled(**sets[0], **outs[0])
    want = t.einsum("mks,nks->smn", sets[0]["A"].float(), sets[0]["B"].float())
    rel = float((got - want).norm() / want.norm())
    if not rel < 1e-3 or bool(t.isnan(got).any()):
        return None, 0.0, 0.0
    us = time_cuda(lambda i: built.compiled(**sets[i], **outs[i]), n)["median_us"]
    fns = [(lambda a=s["A"], b=s["B"]: t.einsum("mks,nks->smn", a, b)) for s in sets]
    return rel, us, time_cuda(lambda i: fns[i](), n)["median_us"]


def main() -> int:
    failed = 0
    for shape in SHAPES:
        path = "/tmp/batch_innermost.habu"
        with open(path, "w") as f:
            f.write("  ".join(f"{v} EXTENT: #{k}" for k, v in shape.items()) + "\n" + TEXT)
        flops = 2 * shape["M"] * shape["N"] * shape["K"] * shape["S"]
        for name, pins in PLANS.items():
            try:
                built = build(path, "INNER", {}, pins)
            except AssertionError as err:
                print(f"{shape} {name}: refused {str(err)[:160]}")
                continue
            k = built.plan.kernels[0]
            exact = ExactChecker(built.model, built.sizes, seed=7).check(built.compiled, kept_types(built.plan))
            if not exact.ok:
                print(f"{shape} {name}: EXACT FAILED {exact.reason()}")
                failed += 1
                continue
            rel, us, ref = timed(built, shape)
            if rel is None:
                print(f"{shape} {name}: GOLDEN FAILED")
                failed += 1
                continue
            print(f"{shape} {name:15s} {k.mma} {k.tile_m}x{k.tile_n}x{k.tile_k} A {k.a_move}/{k.a_vector} "
                  f"B {k.b_move}/{k.b_vector}: {us:8.1f} us {flops / us / 1e6:6.1f} TFLOP/s | torch.einsum "
                  f"{ref:8.1f} us | {ref / us:.2f}x  (rel {rel:.1e}, {exact.summary[:40]})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
