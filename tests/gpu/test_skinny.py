"""Skinny (decode) defaults on the GPU (issue 20 §2): the default plans of 1 to 128 tokens — 64- and
128-row tiles, narrow widths, deep rings, split-K — are bit-exact where the model is integer-exact
(every element, red zones around every buffer) and pass the float64 golden check where it is not,
ragged token counts included."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.plan.plan import ContractionKernel  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from habu.timing.harness import golden_run  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EX = ROOT / "examples"


@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (17, 4096, 14336), (64, 4096, 4096), (100, 14336, 4096),
                                   (128, 4096, 4096)])
def test_skinny_ggemm_defaults_are_bit_exact(m, n, k):
    sizes = {"M": m, "N": n, "K": k}
    built = build(str(EX / "ggemm.habu"), "GGEMM", sizes, check_indices=False)
    (kernel,) = built.plan.kernels
    assert isinstance(kernel, ContractionKernel) and kernel.tile_m <= 128
    result = ExactChecker(built.model, sizes).check(built.compiled, kept_types(built.plan), timeout_s=30.0)
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("example,model,sizes", [
    ("ffn_skip.habu", "FFN-SKIP", {"B": 16}),
    ("ffn_skip.habu", "FFN-SKIP", {"B": 17}),
    ("ffn_skip.habu", "FFN-SKIP", {"B": 128}),
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 1}),
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 16}),
])
def test_skinny_layer_defaults_match_the_float64_reference(example, model, sizes):
    built = build(str(EX / example), model, sizes, check_indices=False)
    for seed in (1, 2):  # fresh inputs each time, outputs poisoned with NaN
        golden = golden_run(built.model, built.sizes, built.compiled, dict(built.plan.storage), seed)
        assert golden.ok, (built.plan.kernels, golden)
