"""A contraction's epilogue with a condition on the output's indices (habu/lower/conditions.py), on the GPU:
the masked products of tests/data/masked_products.habu on each epilogue path, checked bit for bit on
small-integer inputs (the exact differential check: red zones, every element)."""

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
from tests.lower.test_epilogue_conditions import PINS  # noqa: E402

DATA = str(ROOT / "tests" / "data" / "masked_products.habu")


@pytest.mark.parametrize("name", ["TRIANGLE", "SCORES", "BATCHED"])
@pytest.mark.parametrize("path", list(PINS))
def test_a_masked_products_epilogue_is_exact_on_the_gpu(name, path):
    if name == "BATCHED" and path == "cluster-split":
        pytest.skip("the rules refuse a batched product's cluster split")
    built = build(DATA, name, {}, PINS[path])
    assert [k.kind for k in built.plan.kernels] == ["contraction"]
    result = ExactChecker(built.model, built.sizes, seed=11).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


def test_a_batch_shared_mn_major_operand_on_wgmma_is_exact_on_the_gpu():
    """Session 63: attention's dQ form, K[b j e] shared by the heads r and MN-major, now read by wgmma through TMA
    boxes (tests/test_paths.py's regression): bit for bit on small integers."""
    built = build(str(ROOT / "tests" / "data" / "shared_batch_operand.habu"), "SHARED-MN", {}, {})
    assert built.plan.kernels[0].mma == "wgmma"
    result = ExactChecker(built.model, built.sizes, seed=12).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
