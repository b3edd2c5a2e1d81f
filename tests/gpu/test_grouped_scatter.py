"""The MoE combine as a grouped kernel on the GPU (`--pin family=grouped`: the grouped GEMM with the row
factor P[r] and the scatter-add epilogue, tests/data/grouped_scatter.habu): the exact differential check
(integer inputs, red zones), hand-made groupings with empty groups and tokens holding several rows
bit for bit against the float64 combine, an f32 A whose values bf16 cannot hold (its two bf16 parts must
carry them exactly), and the small MoE FFN end to end."""

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

GS = ROOT / "tests" / "data" / "grouped_scatter.habu"
T, N, K, G = 50, 200, 72, 8
PINS = {"family": "grouped"}
COUNTS = [64, 0, 0, 100, 1, 0, 70, 65]  # rows of the 8 groups: inner empty ones, a one-row group, ragged tiles
ROWS = sum(COUNTS)


@pytest.mark.parametrize("model", ["COMBINE-BF16", "COMBINE-F32"])
def test_the_pinned_combine_passes_the_exact_check(model):
    built = build(str(GS), model, {"T": T, "R": ROWS}, PINS)
    assert [k.kind for k in built.plan.kernels] == ["grouped"]
    result = ExactChecker(built.model, built.sizes, seed=ROWS).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


def _combine(model: str, a):
    """Run the pinned combine on `a` (bf16 or f32 rows) with integer weights, router weights and prior
    contents, 300 rows routed to 50 tokens (each token several rows); returns (out, float64 reference)."""
    built = build(str(GS), model, {"T": T, "R": ROWS}, PINS)
    g = torch.Generator().manual_seed(7)
    w = torch.randint(-3, 4, (G, N, K), generator=g).bfloat16().cuda()
    p = torch.randint(-2, 3, (ROWS,), generator=g).float().cuda()
    y0 = torch.randint(-3, 4, (T, N), generator=g).float().cuda()
    ix = torch.randint(0, T, (ROWS,), generator=g).int().cuda()
    e = torch.repeat_interleave(torch.arange(G), torch.tensor(COUNTS)).int().cuda()
    operand = {"A" if model == "COMBINE-BF16" else "AF": a.cuda()}
    out = built.compiled(**operand, W=w, P=p, Y=y0.clone(), IX=ix, E=e)
    out = out["Y"] if isinstance(out, dict) else out
    torch.cuda.synchronize()
    rows = p.double()[:, None] * torch.einsum("rk,rnk->rn", a.cuda().double(), w[e.long()].double())
    return out.double(), y0.double().index_add(0, ix.long(), rows)


def test_hand_made_groupings_and_repeated_tokens_match_the_float64_combine_exactly():
    a = torch.randint(-3, 4, (ROWS, K), generator=torch.Generator().manual_seed(3)).bfloat16()
    out, ref = _combine("COMBINE-BF16", a)
    assert torch.equal(out, ref), f"{int((out != ref).sum())} of {ref.numel()} elements differ"


def test_an_f32_activation_bf16_cannot_hold_is_carried_exactly_by_its_two_bf16_parts():
    """Values m/256 with up to 10 significant bits: hi = bf16(a) loses them, hi + lo holds them; every
    product and partial sum is exact in f32, so only a kernel that drops or misplaces the low parts differs."""
    g = torch.Generator().manual_seed(4)
    a = (torch.randint(-3, 4, (ROWS, K), generator=g) + torch.randint(-127, 128, (ROWS, K), generator=g) / 256.0).float()
    assert (a.bfloat16().float() != a).float().mean() > 0.5
    out, ref = _combine("COMBINE-F32", a)
    assert torch.equal(out, ref), f"{int((out != ref).sum())} of {ref.numel()} elements differ"


def test_the_small_moe_with_the_grouped_combine_matches_the_float64_reference():
    """Experts 0, 3 and 7 get no token; the combine (f32 act in two bf16 parts) within f32 round-off."""
    from habu.timing.harness import compare, make_inputs, reference, tolerance
    from tests.gpu.test_moe import SMALL, routed_with_empty_experts

    tokens = 37
    built = build(str(SMALL), "MOE-FFN", {"T": tokens, "R": 2 * tokens}, PINS)
    assert [k.kind for k in built.plan.kernels] == ["grouped", "grouped", "rows", "grouped"]
    inputs = make_inputs(built.model, built.sizes, seed=tokens)
    inputs["IX"], inputs["E"], _ = routed_with_empty_experts(tokens, 2, 8, {0, 3, 7}, tokens)
    ref = reference(built.model, inputs, built.sizes)["Y"]
    out = built.compiled(**{k: v.clone() for k, v in inputs.items()})
    torch.cuda.synchronize()
    g = compare(out, ref, tolerance(built.model, dict(built.plan.storage)))
    assert g.unwritten == 0 and g.ok, f"relative error {g.rel_error:.2e}"
