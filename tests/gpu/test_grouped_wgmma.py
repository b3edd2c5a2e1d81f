"""The grouped GEMM's wgmma main loop on the GPU (`--pin main_loop=wgmma`, habu/lower/grouped_wgmma.py):
the exact differential check (integer inputs, red-zoned buffers, a sorted grouping) of the gathered GEMM and
of the MoE combine's epilogue (row factor, scatter-add) on bf16 rows, hand-made groupings — empty groups
first, inside and last, a group longer than a tile, one group holding every row — bit for bit against the
float64 product, and the small MoE FFN with gate and up on the wgmma loop."""

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

GW = ROOT / "tests" / "data" / "grouped_wgmma.habu"
T, N, K, G = 300, 200, 136, 8
WGMMA = {"main_loop": "wgmma"}
GROUPINGS = {  # rows of each of the 8 groups (tiles of 128 rows)
    "empty-first-inner-last-and-longer-than-a-tile": [0, 300, 50, 0, 129, 1, 20, 0],
    "one-group-holds-every-row": [0, 0, 0, 500, 0, 0, 0, 0],
}


def _is_wgmma(built) -> None:
    assert [(k.kind, k.main_loop) for k in built.plan.kernels] == [("grouped", "wgmma")]


@pytest.mark.parametrize("rows", [1, 1000])
def test_the_wgmma_loop_passes_the_exact_check(rows):
    built = build(str(GW), "GATHER", {"T": T, "R": rows}, WGMMA)
    _is_wgmma(built)
    result = ExactChecker(built.model, built.sizes, seed=rows).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("name", list(GROUPINGS))
def test_hand_made_groupings_match_the_float64_product_exactly(name):
    counts = GROUPINGS[name]
    rows = sum(counts)
    built = build(str(GW), "GATHER", {"T": T, "R": rows}, {**WGMMA, "bn": "256", "stages": "4"})
    _is_wgmma(built)
    g = torch.Generator().manual_seed(rows)
    x = torch.randint(-3, 4, (T, K), generator=g).bfloat16().cuda()
    w = torch.randint(-3, 4, (G, N, K), generator=g).bfloat16().cuda()
    ix = torch.randint(0, T, (rows,), generator=g).int().cuda()
    e = torch.repeat_interleave(torch.arange(G), torch.tensor(counts)).int().cuda()
    out = built.compiled(X=x, W=w, IX=ix, E=e)
    out = out["Y"] if isinstance(out, dict) else out
    torch.cuda.synchronize()
    ref = torch.einsum("rk,rnk->rn", x[ix.long()].double(), w[e.long()].double())
    assert torch.equal(out.double(), ref), f"{int((out.double() != ref).sum())} of {ref.numel()} elements differ"


def test_the_combine_epilogue_on_the_wgmma_loop_passes_the_exact_check_and_adds_repeated_tokens():
    counts = GROUPINGS["empty-first-inner-last-and-longer-than-a-tile"]
    rows = sum(counts)
    built = build(str(GW), "COMBINE", {"T": 50, "R": rows}, {"family": "grouped", **WGMMA})
    _is_wgmma(built)
    result = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
    g = torch.Generator().manual_seed(7)
    a = torch.randint(-3, 4, (rows, K), generator=g).bfloat16().cuda()
    w = torch.randint(-3, 4, (G, N, K), generator=g).bfloat16().cuda()
    p = torch.randint(-2, 3, (rows,), generator=g).float().cuda()
    z0 = torch.randint(-3, 4, (50, N), generator=g).float().cuda()
    ix = torch.randint(0, 50, (rows,), generator=g).int().cuda()
    e = torch.repeat_interleave(torch.arange(G), torch.tensor(counts)).int().cuda()
    out = built.compiled(A=a, W=w, P=p, Z=z0.clone(), IX=ix, E=e)
    out = (out["Z"] if isinstance(out, dict) else out).double()
    torch.cuda.synchronize()
    contrib = p.double()[:, None] * torch.einsum("rk,rnk->rn", a.double(), w[e.long()].double())
    ref = z0.double().index_add(0, ix.long(), contrib)
    assert torch.equal(out, ref), f"{int((out != ref).sum())} of {ref.numel()} elements differ"


def test_the_small_moe_ffn_with_gate_and_up_on_the_wgmma_loop_passes_the_exact_check():
    built = build(str(ROOT / "tests" / "data" / "moe_small.habu"), "MOE-FFN", {"T": 200, "R": 400},
                  {"family": "grouped", **WGMMA})
    assert [getattr(k, "main_loop", None) for k in built.plan.kernels] == ["wgmma", "wgmma", None, "mma.sync"]
    result = ExactChecker(built.model, built.sizes, seed=11).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
