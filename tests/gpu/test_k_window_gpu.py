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
