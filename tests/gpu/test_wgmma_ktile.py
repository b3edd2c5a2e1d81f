"""wgmma k tiles of several 128-byte swizzle spans on the GPU (issue 20 §2): a K-major operand's k tile
kept as blocks of 64 columns along k, one TMA box (or the cp.async copies of a gathered A) each, the
descriptors stepping from block to block; an N-major weight's k tile as taller 64-column boxes.
Bit-exact on GGEMM (every element, red zones; ragged m, n and k), float64 golden on the layers whose
weights are N-major (FFN-SKIP, RMSNorm+Linear)."""

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

EX = ROOT / "examples"


def _pins(tile: str, stages: int, split: int = 1, store: str = "direct") -> dict[str, str]:
    pins = {"tile": tile, "stages": str(stages), "store": store, "split_k": str(split)}
    return pins | ({"split_reduce": "cluster"} if split > 1 else {})


@pytest.mark.parametrize("sizes,pins", [
    ({"M": 100, "N": 300, "K": 1000}, _pins("64x64x128", 4, 2)),  # two k boxes a stage, cluster split
    ({"M": 130, "N": 200, "K": 1000}, _pins("64x64x256", 3)),  # four k boxes, ragged k tail
])
def test_ktile_ggemm_is_bit_exact(sizes, pins):
    built = build(str(EX / "ggemm.habu"), "GGEMM", sizes, pins, check_indices=False)
    (kernel,) = built.plan.kernels
    assert kernel.tile_k == int(pins["tile"].rsplit("x", 1)[1])
    result = ExactChecker(built.model, sizes).check(built.compiled, kept_types(built.plan), timeout_s=30.0)
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("example,model,sizes,pins", [
    ("ffn_skip.habu", "FFN-SKIP", {"B": 17}, _pins("64x128x256", 2)),
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 16}, _pins("64x64x128", 6, 2)),
])
def test_ktile_layers_match_the_float64_reference(example, model, sizes, pins):
    built = build(str(EX / example), model, sizes, pins, check_indices=False)
    assert any(getattr(k, "tile_k", 64) > 64 for k in built.plan.kernels)
    golden = golden_run(built.model, built.sizes, built.compiled, dict(built.plan.storage), 3)
    assert golden.ok, (built.plan.kernels, golden)


# B ahead (`b_ahead`, habu/lower/pipeline.py MbarrierRing.ahead): B's TMA boxes of a tile's first stages go
# before A's gathered row offsets and before the wait for the plan's previous kernel
@pytest.mark.parametrize("sizes,pins", [
    ({"M": 100, "N": 300, "K": 1000}, {**_pins("64x64x64", 6, 2), "b_ahead": "true"}),  # cp.async A, cluster split
    ({"M": 1000, "N": 2000, "K": 520}, {**_pins("64x64x128", 3), "b_ahead": "true", "persistent": "true"}),
])
def test_b_ahead_ggemm_is_bit_exact(sizes, pins):
    built = build(str(EX / "ggemm.habu"), "GGEMM", sizes, pins, check_indices=False)
    (kernel,) = built.plan.kernels
    assert kernel.b_ahead
    result = ExactChecker(built.model, sizes).check(built.compiled, kept_types(built.plan), timeout_s=30.0)
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("example,model,sizes,pins", [
    ("ffn_skip.habu", "FFN-SKIP", {"B": 17}, {"b_ahead": "true"}),  # all-TMA rings, the second after a PDL wait
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 16}, {"b_ahead": "true"}),  # W ahead of the RMSNorm kernel
])
def test_b_ahead_layers_match_the_float64_reference(example, model, sizes, pins):
    built = build(str(EX / example), model, sizes, pins, check_indices=False)
    assert any(getattr(k, "b_ahead", False) for k in built.plan.kernels)
    golden = golden_run(built.model, built.sizes, built.compiled, dict(built.plan.storage), 3)
    assert golden.ok, (built.plan.kernels, golden)
