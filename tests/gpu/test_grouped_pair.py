"""Gate, up and the node of both in one grouped kernel on the GPU (`--pin pair=fused`, two accumulators):
the exact differential check on the integer-exact product (tests/data/grouped_pair.habu), hand-made
groupings bit for bit against float64, SwiGLU within f32 round-off, and the small MoE FFN in two grouped
kernels (`pair=fused` + `family=grouped`) against the float64 reference."""

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

GP = ROOT / "tests" / "data" / "grouped_pair.habu"
T, N, K, G = 50, 200, 72, 8
FUSED = {"pair": "fused"}
COUNTS = [0, 100, 50, 50, 50, 25, 20, 5]  # the first group empty, groups shorter and longer than a tile
ROWS = sum(COUNTS)


def test_the_fused_pair_passes_the_exact_check():
    built = build(str(GP), "PAIR-PRODUCT", {"T": T, "R": ROWS}, FUSED)
    assert [k.nodes for k in built.plan.kernels] == [("gate", "up", "Y")]
    result = ExactChecker(built.model, built.sizes, seed=ROWS).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model", ["PAIR-PRODUCT", "PAIR-SWIGLU"])
def test_hand_made_groupings_match_the_float64_pair(model):
    built = build(str(GP), model, {"T": T, "R": ROWS}, FUSED)
    g = torch.Generator().manual_seed(11)
    x = torch.randint(-3, 4, (T, K), generator=g).bfloat16().cuda()
    w1 = torch.randint(-3, 4, (G, N, K), generator=g).bfloat16().cuda()
    w3 = torch.randint(-3, 4, (G, N, K), generator=g).bfloat16().cuda()
    ix = torch.randint(0, T, (ROWS,), generator=g).int().cuda()
    e = torch.repeat_interleave(torch.arange(G), torch.tensor(COUNTS)).int().cuda()
    out = built.compiled(X=x, W1=w1, W3=w3, IX=ix, E=e)
    out = (out["Y"] if isinstance(out, dict) else out).double()
    torch.cuda.synchronize()
    rows = x[ix.long()].double()
    gate = torch.einsum("rk,rnk->rn", rows, w1[e.long()].double())
    up = torch.einsum("rk,rnk->rn", rows, w3[e.long()].double())
    if model == "PAIR-PRODUCT":  # integers below 2^24: exact
        assert torch.equal(out, gate * up), f"{int((out != gate * up).sum())} elements differ"
    else:  # gate and up exact; sigmoid and the products in f32
        ref = gate * torch.sigmoid(gate) * up
        assert float(((out - ref).abs() / ref.abs().clamp_min(1.0)).max()) < 1e-4  # __expf in sigmoid


def test_the_small_moe_in_two_grouped_kernels_matches_the_float64_reference():
    from habu.timing.harness import compare, make_inputs, reference, tolerance
    from tests.gpu.test_moe import SMALL, routed_with_empty_experts

    tokens = 37
    built = build(str(SMALL), "MOE-FFN", {"T": tokens, "R": 2 * tokens}, {**FUSED, "family": "grouped"})
    assert [k.nodes for k in built.plan.kernels] == [("gate", "up", "act"), ("Y",)]
    inputs = make_inputs(built.model, built.sizes, seed=tokens)
    inputs["IX"], inputs["E"], _ = routed_with_empty_experts(tokens, 2, 8, {0, 3, 7}, tokens)
    ref = reference(built.model, inputs, built.sizes)["Y"]
    out = built.compiled(**{k: v.clone() for k, v in inputs.items()})
    torch.cuda.synchronize()
    g = compare(out, ref, tolerance(built.model, dict(built.plan.storage)))
    assert g.unwritten == 0 and g.ok, f"relative error {g.rel_error:.2e}"
