"""General kernels whose reduction loops run once for a vector of consecutive output elements (session 64,
habu/emit_cuda/emit_general.py `_emit_vector`), on the GPU: tests/data/vector_loops.habu's models (a sum over a
leading axis as GQA attention's backward sums dK and dV over its query heads, factors outside the loop, a sum and a
max, a mask) exact on small integers, every element, NaN-poisoned outputs, with the default vector and with
pinned vectors of 2 over two sweeps and of 4 at ragged sizes; attention's backward at 16 × 1k against the float64
reference is in test_backward_gpu.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.plan.plan import GeneralKernel  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

DATA = str(ROOT / "tests" / "data" / "vector_loops.habu")
MODELS = sorted(load_program(DATA).models)
SHAPES = {  # pins, sizes
    "default": ({}, {}),
    "vector-2-sweeps-2": ({"vector": "2", "elements": "2"}, {}),
    "ragged": ({"vector": "4"}, {"J": 37, "B": 3}),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("name", MODELS)
def test_a_vector_reduction_loop_is_exact(name, shape):
    pins, sizes = SHAPES[shape]
    built = build(DATA, name, sizes, pins)
    (kernel,) = built.plan.kernels
    assert isinstance(kernel, GeneralKernel) and kernel.vector > 1, built.plan.kernels
    result = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
