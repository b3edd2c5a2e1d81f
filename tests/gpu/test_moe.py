"""The MoE FFN (several equations, a grouping, gathered expert weights, the scatter combine) on the
GPU through its proven default plan: random inputs with experts left empty (the first, an inner one
and the last), compared with the float64 reference; and the three example shapes at 16 tokens."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.moe_speed import rel_error, routing, torch_loop  # noqa: E402
from habu.bench.run import build  # noqa: E402
from habu.timing.harness import compare, make_inputs, reference, tolerance  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

SMALL = ROOT / "tests" / "data" / "moe_small.habu"


def routed_with_empty_experts(tokens: int, topk: int, experts: int, empty: set[int], seed: int):
    g = torch.Generator().manual_seed(seed)
    live = torch.tensor([e for e in range(experts) if e not in empty])
    choice = torch.stack([live[torch.randperm(len(live), generator=g)[:topk]] for _ in range(tokens)])
    token = torch.arange(tokens).repeat_interleave(topk)
    expert = choice.reshape(-1)
    order = torch.argsort(expert, stable=True)
    offsets = torch.cumsum(torch.bincount(expert, minlength=experts), 0)
    return token[order].int().cuda(), expert[order].int().cuda(), offsets.int().cuda()


@pytest.mark.parametrize("tokens", [1, 5, 37])
def test_a_small_moe_with_empty_experts_matches_the_float64_reference(tokens):
    """Experts 0, 3 and 7 (the first, an inner one, the last) get no token."""
    built = build(str(SMALL), "MOE-FFN", {"T": tokens, "R": 2 * tokens})
    inputs = make_inputs(built.model, built.sizes, seed=tokens)
    inputs["IX"], inputs["E"], offsets = routed_with_empty_experts(tokens, 2, 8, {0, 3, 7}, tokens)
    ref = reference(built.model, inputs, built.sizes)["Y"]
    loop = torch_loop(inputs["X"], inputs, inputs["IX"], inputs["P"], offsets, inputs["Y"].double(),
                      dtype=torch.float64)  # the benchmark's reference agrees with the language's
    assert compare(loop, ref, 1e-12).ok
    out = built.compiled(**{k: v.clone() for k, v in inputs.items()})
    torch.cuda.synchronize()
    g = compare(out, ref, tolerance(built.model, dict(built.plan.storage)))  # the storage decides (f32 here: Y, an f32 matrix, is an input)
    assert g.unwritten == 0 and g.ok, f"relative error {g.rel_error:.2e} ({built.plan.kernels})"


@pytest.mark.parametrize("example,topk", [("moe_mixtral.habu", 2), ("moe_qwen3_30b_a3b.habu", 8),
                                          ("moe_deepseek_v3.habu", 8)])
def test_the_moe_examples_at_16_tokens_with_zipf_routing_match_a_float64_loop(example, topk):
    from habu.bench.moe_speed import SHAPES, weights

    shape = next(s for s in SHAPES.values() if s.file == example)
    built = build(str(ROOT / "examples" / example), "MOE-FFN", {"T": 16, "R": 16 * topk})
    ix, e, p, offsets = routing(16, topk, shape.experts, "zipf", seed=3)
    w = weights(shape, seed=3)
    x = torch.randn((16, shape.d), device="cuda").bfloat16()
    y = torch.randn((16, shape.d), device="cuda")
    ref = torch_loop(x, w, ix, p, offsets, y.double(), dtype=torch.float64)
    out = built.compiled(X=x, W1=w["W1"], W3=w["W3"], W2=w["W2"], P=p, Y=y.clone(), IX=ix, E=e)
    torch.cuda.synchronize()
    # act is stored in bf16 (the model's matrices are bf16; torch's bf16 layer rounds it too)
    assert rel_error(out, ref) <= tolerance(built.model, dict(built.plan.storage))
