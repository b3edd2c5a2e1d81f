"""The consumer lag on the GPU (`consumer_lag`: the second consumer warpgroup starts a tile's k loop once the first
has multiplied `lag` k tiles): bit for bit (exact check, small-integer inputs, red zones) with more k tiles than
the lag, fewer, beside a column sum in the epilogue, with three consumers, and persistent (the barrier once a
tile)."""

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

CASES = {
    "ggemm-k512": ("examples/ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 512}, {"tile": "128x128x64"}),
    "ggemm-one-k-tile": ("examples/ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 64}, {"tile": "128x128x64"}),
    "column-sum": ("tests/data/column_epilogue.habu", "BIASED-COLSUM", {"M": 128, "N": 1000, "K": 520},
                   {"tile": "128x128x64"}),
    "three-consumers": ("examples/gemm.habu", "GEMM", {"M": 192, "N": 256, "K": 1024},
                        {"tile": "192x128x64", "warps": "16"}),
    # a persistent block's tiles, each one phase of the named barrier (more k tiles than the ring's stages)
    "persistent": ("examples/gemm.habu", "GEMM", {"M": 1000, "N": 1300, "K": 1024},
                   {"tile": "128x128x64", "persistent": "true"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_lagged_kernel_passes_the_exact_check(case):
    path, model, sizes, pins = CASES[case]
    built = build(str(ROOT / path), model, sizes, {**pins, "lag": "2"})
    assert any(getattr(k, "consumer_lag", 0) == 2 for k in built.plan.kernels)
    result = ExactChecker(built.model, built.sizes, seed=13).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
