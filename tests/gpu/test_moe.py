"""The MoE FFN (several equations, a grouping, gathered expert weights, the scatter combine) on the
GPU through its proven default plan, fast (one small build: a few seconds on a bare machine): random
inputs with experts left empty (the first, an inner one and the last), compared with the float64
reference. The example shapes (Mixtral, Qwen3, DeepSeek-V3 at 16 tokens) and more token counts are in
tests/gpu/test_moe_examples.py (slow: each example's kernels compile for a minute on one core)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.moe_speed import torch_loop  # noqa: E402
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


def check_small_moe(tokens: int) -> None:
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


def test_a_small_moe_with_empty_experts_matches_the_float64_reference():
    """37 tokens: 74 routed rows over 5 live experts (groups longer than a 64-row tile's half, three empty)."""
    check_small_moe(37)
