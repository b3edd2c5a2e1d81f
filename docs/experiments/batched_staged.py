"""Products whose operands TMA cannot read in place (session 70): the default now stages them (a pass copies each
operand k-major into 16-byte-aligned rows, zeros past #K, a batched one's batch axes outermost) and multiplies on
wgmma by TMA, or on mma.sync by 16-byte cp.async. Against the plans they had before (session 69: wgmma reading by
ldg one element at a time at K = 511; mma.sync copying a batch-innermost A, or K = 511 rows, an element at a time),
and torch in the same run.

    python docs/experiments/batched_staged.py

Each plan passes the exact differential check first (small integers, red zones), then a golden check against
torch in float32 on N(0,1) inputs; times are medians of CUDA events over input sets rotated past the L2. torch
runs the same product on the same bf16 inputs with bf16 output (Habu's is f32: its stores are twice the bytes)."""
import sys

from habu.bench.gpu_bench import sets_for
from habu.bench.run import build
from habu.timing.exact import kept_types
from habu.timing.exact_gpu import ExactChecker
from habu.timing.harness import make_inputs, poisoned_outputs, time_cuda, torch

INNER = ("bf16 TENSOR: A ( #M #K #S )  bf16 TENSOR: B ( #N #K #S )  f32 TENSOR: Y ( #S #M #N )\n"
         "MODEL: P  Y[s m n] = Σ k A[m k s] · B[n k s] ;\n", "mks,nks->smn")
ROWS = ("bf16 TENSOR: A ( #S #M #K )  bf16 TENSOR: B ( #S #N #K )  f32 TENSOR: Y ( #S #M #N )\n"
        "MODEL: P  Y[s m n] = Σ k A[s m k] · B[s n k] ;\n", "smk,snk->smn")
PLAIN = ("bf16 TENSOR: A ( #M #K )  bf16 TENSOR: B ( #N #K )  f32 TENSOR: Y ( #M #N )\n"
         "MODEL: P  Y[m n] = Σ k A[m k] · B[n k] ;\n", "mk,nk->mn")
CASES = (  # (name, model text and einsum, shape, plans)
    # the mma.sync path (sm_80's) at K = 511: staged and read in 16-byte cp.async vectors, against 2-byte loads
    ("gemm-k511", PLAIN, {"M": 4096, "N": 4096, "K": 511},
     {"default (wgmma)": {}, "mma.sync staged": {"mma": "mma.sync"},
      "mma.sync in place (session 69)": {"mma": "mma.sync", "A": "ldg", "B": "ldg", "vector": "1"}}),
    ("k511", ROWS, {"S": 16, "M": 1024, "N": 1024, "K": 511},
     {"default": {}, "in place (session 69)": {"A": "ldg", "B": "ldg", "vector": "1"}}),
    ("k511-wide", ROWS, {"S": 8, "M": 2048, "N": 2048, "K": 1023},
     {"default": {}, "in place (session 69)": {"A": "ldg", "B": "ldg", "vector": "1"}}),
    ("inner", INNER, {"M": 512, "N": 512, "K": 256, "S": 16},
     {"default": {}, "mma.sync staged": {"mma": "mma.sync"},
      "mma.sync in place (session 69)": {"mma": "mma.sync", "A": "ldg", "B": "ldg", "vector": "1"}}),
    ("inner-tall", INNER, {"M": 2048, "N": 256, "K": 128, "S": 8},
     {"default": {}, "mma.sync in place (session 69)": {"mma": "mma.sync", "A": "ldg", "B": "ldg", "vector": "1"}}),
)


def timed(built, shape: dict[str, int], spec: str) -> tuple[float | None, float, float]:
    """(the golden check's relative error, or None where it failed; Habu's µs; torch.einsum's µs)."""
    t = torch()
    batches = shape.get("S", 1)
    per_set = 2 * (shape["M"] + shape["N"]) * shape["K"] * batches + 4 * batches * shape["M"] * shape["N"]
    n = sets_for(per_set)
    sets = [make_inputs(built.model, built.sizes, 300 + i) for i in range(n)]
    outs = [poisoned_outputs(built.model, built.sizes) for _ in range(n)]
    got = built.compiled(**sets[0], **outs[0])
    want = t.einsum(spec, sets[0]["A"].float(), sets[0]["B"].float())
    rel = float((got - want).norm() / want.norm())
    if not rel < 1e-3 or bool(t.isnan(got).any()):
        return None, 0.0, 0.0
    us = time_cuda(lambda i: built.compiled(**sets[i], **outs[i]), n)["median_us"]
    fns = [(lambda a=s["A"], b=s["B"]: t.einsum(spec, a, b)) for s in sets]
    return rel, us, time_cuda(lambda i: fns[i](), n)["median_us"]


def main() -> int:
    failed = 0
    for case, (text, spec), shape, plans in CASES:
        path = f"/tmp/batched_staged_{case}.habu"
        with open(path, "w") as f:
            f.write("  ".join(f"{v} EXTENT: #{k}" for k, v in shape.items()) + "\n" + text)
        flops = 2 * shape["M"] * shape["N"] * shape["K"] * shape.get("S", 1)
        for name, pins in plans.items():
            try:
                built = build(path, "P", {}, pins)
            except AssertionError as err:
                print(f"{case} {name}: refused {str(err)[:160]}")
                continue
            k = built.plan.kernels[0]
            exact = ExactChecker(built.model, built.sizes, seed=7).check(built.compiled, kept_types(built.plan))
            if not exact.ok:
                print(f"{case} {name}: EXACT FAILED {exact.reason()}")
                failed += 1
                continue
            rel, us, ref = timed(built, shape, spec)
            if rel is None:
                print(f"{case} {name}: GOLDEN FAILED")
                failed += 1
                continue
            print(f"{case:10s} {name:30s} {k.mma} {k.tile_m}x{k.tile_n}x{k.tile_k} A {k.a_move}/{k.a_vector} "
                  f"B {k.b_move}/{k.b_vector}: {us:8.1f} us {flops / us / 1e6:6.1f} TFLOP/s | torch.einsum "
                  f"{ref:8.1f} us | {ref / us:.2f}x  (rel {rel:.1e})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
