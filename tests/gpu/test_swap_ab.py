"""Transposed products (`swap_ab`) on the GPU: every path's pinned transposed plans (ragged tiles each way, cluster
splits, gathered tokens, MN-major weights) are bit-exact against the integer model, every element, red zones
around every buffer; the transposed skinny defaults are covered by tests/gpu/test_skinny.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from habu.timing.harness import golden_run  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.prove.test_swap_ab import LINEAR_KN, SWAPPED  # noqa: E402


@pytest.mark.parametrize("example,name,sizes,pins", SWAPPED, ids=lambda x: str(x) if isinstance(x, str) else None)
def test_transposed_plans_are_bit_exact(example, name, sizes, pins, tmp_path):
    if example == "kn":
        path = tmp_path / "kn.habu"
        path.write_text(LINEAR_KN)
    else:
        path = ROOT / "examples" / example
    built = build(str(path), name, sizes, pins, check_indices=False)
    assert any(getattr(k, "swap_ab", False) for k in built.plan.kernels)
    result = ExactChecker(built.model, sizes).check(built.compiled, kept_types(built.plan), timeout_s=30.0)
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("example,model,sizes", [
    ("ffn_skip.habu", "FFN-SKIP", {"B": 16}), ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 16})])
def test_transposed_layers_with_the_weights_ahead_match_the_float64_reference(example, model, sizes):
    """The later product of a chain starts early (programmatic dependent launch) and issues its weights' boxes
    before it waits for the earlier kernel's output (`a_ahead`), 22 stages deep."""
    pins = {"swap_ab": "1", "tile": "64x16x64", "stages": "22", "split_k": "2", "split_reduce": "cluster",
            "a_ahead": "1"}
    built = build(str(ROOT / "examples" / example), model, sizes, pins, check_indices=False)
    for seed in (1, 2):  # fresh inputs each time, outputs poisoned with NaN
        golden = golden_run(built.model, built.sizes, built.compiled, dict(built.plan.storage), seed)
        assert golden.ok, (built.plan.kernels, golden)
