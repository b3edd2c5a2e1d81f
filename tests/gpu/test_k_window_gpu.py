"""Products that skip the k tiles a causal mask makes zero (habu/lower/k_bounds.py), on the GPU: the chains of
tests/data/causal_chain.habu (a masked product and the product reading it, straight and transposed, as attention's
backward's dQ and dK read dS) checked bit for bit on small integers on each path (the exact differential check:
red zones, every element), and the same plans with `skip_zero=false` for the same values."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

DATA = str(ROOT / "tests" / "data" / "causal_chain.habu")
PINS = {
    "default": {},
    "wgmma-64": {"tile": "64x64x64"},
    "wgmma-128": {"tile": "128x128x64"},
    "persistent": {"tile": "64x64x64", "persistent": "true"},
    "mma.sync": {"mma": "mma.sync"},
    "fma": {"mma": "fma"},
    "unskipped": {"skip_zero": "false"},
}


@pytest.mark.parametrize("path", list(PINS))
@pytest.mark.parametrize("name", ["CAUSAL-CHAIN", "CAUSAL-CHAIN-T"])
def test_a_causal_chain_skipping_zero_k_tiles_is_exact_on_the_gpu(name, path):
    built = build(DATA, name, {}, PINS[path])
    assert [k.kind for k in built.plan.kernels] == ["contraction", "contraction"]
    assert all(k.skip_zero == (path != "unskipped") for k in built.plan.kernels)
    result = ExactChecker(built.model, built.sizes, seed=13).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


# session 67's fuzz findings (tests/lower/test_k_bounds.py's regression tests), their exp and erf squared so that the
# exact check applies (it refuses transcendental functions): the first product of each backward stores the masked
# %h2 = dY·mask·(A·Wᵀ + C) with its zero tiles' k loops skipped and (column-sum) dC's column sum in the same
# epilogue, the counters of its column tiles reached by every block, a zero tile's too; (staged) dA reads %h1
# through a staged copy inside its window
FUZZ = {
    "column-sum": "256 EXTENT: #M 128 EXTENT: #N 64 EXTENT: #K\nbf16 TENSOR: A ( #M #K )\nbf16 TENSOR: W ( #N #K )\n"
                  "f32 TENSOR: C ( #N )\nbf16 TENSOR: Y ( #M #N )\nMODEL: FZ  Y[m n] = ((Σ k A[m k] · W[n k]) + C[n]) · "
                  "((Σ k A[m k] · W[n k]) + C[n]) · where(n ≤ m + #N − #M, 1, 0) ;\n",
    "staged": "256 EXTENT: #M 511 EXTENT: #N 16 EXTENT: #K\nbf16 TENSOR: A ( #K #M )\nbf16 TENSOR: W ( #N #K )\n"
              "bf16 TENSOR: Y ( #M #N )\nMODEL: FZ  Y[m n] = where(n ≤ m + #N − #M, (Σ k A[k m] · W[n k]) · "
              "(Σ k A[k m] · W[n k]), 0) + 1 ;\n",
}


@pytest.mark.parametrize("case", list(FUZZ))
def test_a_derived_backward_skipping_zero_k_tiles_is_exact_on_the_gpu(case):
    from habu.bench.run import build_model
    from habu.cli_grad import backward_program
    from habu.lower import lower_plan
    from habu.lower.contraction import ContractionLowering
    from habu.spec.parser import parse_text

    program, name = backward_program(parse_text(FUZZ[case], "fuzz.habu"), "FZ", None, "auto")
    built = build_model(program.models[name])
    products = [lw for lw in lower_plan(built.model, built.plan) if isinstance(lw, ContractionLowering)]
    if case == "column-sum":
        assert products[0].window.outputs and products[0].column_sum is not None
    else:
        assert any(lw.window and lw.b.tensor.startswith("@") for lw in products)
    result = ExactChecker(built.model, built.sizes, seed=13).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
