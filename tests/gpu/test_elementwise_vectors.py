"""Elementwise regions as general kernels moving vectors (`elementwise_vectors`, habu/paths/__init__.py) and
a heavy epilogue cut from its contraction (habu/search/cuts.py), on the GPU: the chain's kernel is exact on
small integers (every element, NaN-poisoned output), and the cut GELU plan matches torch."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.plan.plan import ContractionKernel, GeneralKernel  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from habu.timing.harness import make_inputs, poisoned_outputs  # noqa: E402

CHAIN = """\
{B} EXTENT: #B  1 EXTENT: #ONE  {H} EXTENT: #H
{dt} TENSOR: X ( #B #H )  {dt} TENSOR: B1 ( #ONE #H )  {dt} TENSOR: RES ( #B #H )  {dt} TENSOR: Y ( #B #H )
MODEL: CHAIN ( x b1 res -- y )  ROT ROT ADD  SQUARE  RESIDUAL-ADD ;
"""


@pytest.mark.parametrize("dt,vector", [("bf16", 8), ("f32", 4)])
def test_an_elementwise_chain_moving_vectors_is_exact(tmp_path, dt, vector):
    path = tmp_path / "chain.habu"
    path.write_text(CHAIN.format(B=4096, H=776, dt=dt))
    built = build(str(path), "CHAIN", {})
    (kernel,) = built.plan.kernels
    assert isinstance(kernel, GeneralKernel) and kernel.vector == vector, built.plan.kernels
    result = ExactChecker(built.model, built.sizes, seed=3).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


LIN_GELU = """\
{B} EXTENT: #B  1 EXTENT: #ONE  14336 EXTENT: #H  4096 EXTENT: #D
bf16 TENSOR: X ( #B #D )  bf16 TENSOR: W ( #D #H )  bf16 TENSOR: B1 ( #ONE #H )  bf16 TENSOR: Y ( #B #H )
MODEL: LIN-GELU ( x w b1 -- y )  LINEAR GELU ;
"""


def test_a_linear_with_its_gelu_cut_matches_torch(tmp_path):
    path = tmp_path / "lin_gelu.habu"
    path.write_text(LIN_GELU.format(B=4096))
    built = build(str(path), "LIN-GELU", {}, witness=True)
    first, second = built.plan.kernels
    assert isinstance(first, ContractionKernel) and isinstance(second, GeneralKernel)
    inputs = make_inputs(built.model, built.sizes, 9)
    got = built.compiled(**inputs, **poisoned_outputs(built.model, built.sizes)).float()
    x = inputs["X"].float() @ inputs["W"].float()
    want = torch.nn.functional.gelu(x.to(torch.bfloat16).float() + inputs["B1"].float())
    rel = float((got - want).norm() / want.norm())
    assert not bool(torch.isnan(got).any()) and rel < 1e-2, rel
