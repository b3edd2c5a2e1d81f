"""The MoE FFN's slower GPU checks (each build compiles its kernels anew): the small MoE at 1 and 5 tokens,
and the three example shapes (Mixtral 8×7B, Qwen3-30B-A3B-like, DeepSeek-V3-like) at 16 tokens with Zipf
routing, through their proven default plans, against a float64 loop. The fast check is tests/gpu/test_moe.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.moe_speed import rel_error, routing, torch_loop  # noqa: E402
from habu.bench.run import build  # noqa: E402
from habu.timing.harness import tolerance  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.gpu.test_moe import check_small_moe  # noqa: E402


@pytest.mark.parametrize("tokens", [1, 5])
def test_a_small_moe_at_one_and_five_tokens_matches_the_float64_reference(tokens):
    check_small_moe(tokens)


def check_example(example: str, topk: int, pins: dict[str, str] | None = None):
    """The example at 16 tokens, Zipf routing, against a float64 loop; the built plan."""
    from habu.bench.moe_speed import SHAPES, weights

    shape = next(s for s in SHAPES.values() if s.file == example)
    built = build(str(ROOT / "examples" / example), "MOE-FFN", {"T": 16, "R": 16 * topk}, pins)
    ix, e, p, offsets = routing(16, topk, shape.experts, "zipf", seed=3)
    w = weights(shape, seed=3)
    x = torch.randn((16, shape.d), device="cuda").bfloat16()
    y = torch.randn((16, shape.d), device="cuda")
    ref = torch_loop(x, w, ix, p, offsets, y.double(), dtype=torch.float64)
    out = built.compiled(X=x, W1=w["W1"], W3=w["W3"], W2=w["W2"], P=p, Y=y.clone(), IX=ix, E=e)
    torch.cuda.synchronize()
    # act is stored in bf16 (the model's matrices are bf16; torch's bf16 layer rounds it too)
    assert rel_error(out, ref) <= tolerance(built.model, dict(built.plan.storage))
    return built


@pytest.mark.parametrize("example,topk", [("moe_mixtral.habu", 2), ("moe_qwen3_30b_a3b.habu", 8),
                                          ("moe_deepseek_v3.habu", 8)])
def test_the_moe_examples_at_16_tokens_with_zipf_routing_match_a_float64_loop(example, topk):
    check_example(example, topk)


def test_deepseek_v3_on_the_wgmma_loop_with_32_bit_indices_matches_a_float64_loop():
    """DeepSeek-V3's weights (3.8·10^9 elements a projection) through TMA coordinates: the wgmma loop's
    kernels form every other offset in 32 bits (habu.paths.grouped.pointer_index_width)."""
    built = check_example("moe_deepseek_v3.habu", 8, {"family": "grouped", "main_loop": "wgmma", "pair": "fused"})
    assert [(k.main_loop, k.index_width) for k in built.plan.kernels] == [("wgmma", 32), ("wgmma", 32)]
