"""Grouped GEMMs over n-major weights on the GPU (`W[E[r] k n]`, habu/lower/grouped_wgmma.py: 64-column TMA
boxes read with wgmma's transpose bit): the exact differential check (integer inputs, red-zoned buffers, a
sorted grouping), hand-made groupings bit for bit against the float64 product, and `terms:T`'s two grouped
products and their scatter-add (habu/plan/term_split.py)."""

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

GN = ROOT / "tests" / "data" / "grouped_n_major.habu"
T, N, K, G = 300, 200, 136, 8
COUNTS = {  # rows of each of the 8 groups (tiles of 128 or 64 rows)
    "empty-first-inner-last-and-longer-than-a-tile": [0, 300, 50, 0, 129, 1, 20, 0],
    "one-group-holds-every-row": [0, 0, 0, 500, 0, 0, 0, 0],
}


@pytest.mark.parametrize("model", ["GATHER-T", "DACT", "TWO-TERMS"])
def test_the_n_major_defaults_pass_the_exact_check(model):
    rows = 1000
    built = build(str(GN), model, {"T": T, "R": rows}, {})
    grouped = [k for k in built.plan.kernels if k.kind == "grouped"]
    assert grouped and all(k.main_loop == "wgmma" for k in grouped), built.plan.kernels
    result = ExactChecker(built.model, built.sizes, seed=rows).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("name", list(COUNTS))
@pytest.mark.parametrize("tile", [{}, {"bn": "256", "stages": "4"}, {"bm": "128", "warps_m": "2"}])
def test_hand_made_groupings_match_the_float64_product_exactly(name, tile):
    counts = COUNTS[name]
    rows = sum(counts)
    built = build(str(GN), "DACT", {"T": T, "R": rows}, {"family": "grouped", **tile})
    assert [(k.kind, k.main_loop) for k in built.plan.kernels] == [("grouped", "wgmma")]
    g = torch.Generator().manual_seed(rows)
    dy = torch.randint(-3, 4, (T, K), generator=g).float().cuda()
    w = torch.randint(-3, 4, (G, K, N), generator=g).bfloat16().cuda()
    p = torch.randint(-2, 3, (rows,), generator=g).float().cuda()
    ix = torch.randint(0, T, (rows,), generator=g).int().cuda()
    e = torch.repeat_interleave(torch.arange(G), torch.tensor(counts)).int().cuda()
    out = built.compiled(DY=dy, W=w, P=p, IX=ix, E=e)
    out = out["Y"] if isinstance(out, dict) else out
    torch.cuda.synchronize()
    ref = p.double()[:, None] * torch.einsum("rk,rkn->rn", dy[ix.long()].double(), w[e.long()].double())
    assert torch.equal(out.double(), ref), f"{int((out.double() != ref).sum())} of {ref.numel()} elements differ"
