"""The grouped weight gradient on the GPU (habu/lower/grouped_wgrad.py: `O[E[r] m n] += A[r m] · B[IX[r] n]`, each
group's product over its own rows on wgmma): the exact differential check (integer inputs, red-zoned buffers, a
sorted grouping) of the four forms (an f32 A in two bf16 parts, a bf16 A, a gathered f32 A times the row's
factor, a gathered bf16 A times it, rounded to bf16), and hand-made groupings with an f32 A bf16 cannot hold, bit for bit against the float64 product."""

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

GW = ROOT / "tests" / "data" / "grouped_wgrad.habu"
T, M, N, G = 300, 136, 200, 8
COUNTS = {  # rows of each of the 8 groups (k tiles of 64 rows)
    "empty-first-inner-last-and-several-k-tiles": [0, 300, 50, 0, 129, 1, 20, 0],
    "one-group-holds-every-row": [0, 0, 0, 500, 0, 0, 0, 0],
}


def _is_wgrad(built) -> None:
    assert [(k.kind, k.main_loop) for k in built.plan.kernels] == [("grouped", "wgmma")]


@pytest.mark.parametrize("copy", ["staged", "staged-tile", "cp.async", "registers"])
@pytest.mark.parametrize("model", ["WGRAD", "WGRAD-BF16", "WGRAD-P", "WGRAD-P-BF16"])
def test_the_wgrad_loop_passes_the_exact_check(model, copy):
    """(`copy`: the producer's route for the operands, `wgrad_copy`: staged, the default, converts an f32 or a scaled A
    in the consumers; the default's blocks walk the tiles, `staged-tile` is a block a tile.)"""
    rows = 1000
    pins = {"wgrad_copy": "staged", "wgrad_persistent": "false"} if copy == "staged-tile" else {"wgrad_copy": copy}
    built = build(str(GW), model, {"T": T, "R": rows}, pins)
    _is_wgrad(built)
    result = ExactChecker(built.model, built.sizes, seed=rows).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("walk", ["true", "false"])
def test_regression_more_groups_than_a_tiles_column_groups_pass_the_exact_check(walk):
    """40 groups, more than a 128-column tile's 16 column groups: the emitter's shadowed `groups` made the kernel find
    only 16 offsets (tests/prove/test_grouped_wgrad.py has the CPU side)."""
    built = build(str(GW), "WGRAD-BF16", {"T": T, "R": 1000, "G": 40}, {"wgrad_persistent": walk})
    _is_wgrad(built)
    result = ExactChecker(built.model, built.sizes, seed=40).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model", ["WGRAD", "WGRAD-P"])
def test_the_staged_producer_without_the_index_ring_passes_the_exact_check(model):
    """`wgrad_index_ring=false`: each chunk's IX[r] loaded as its copy needs it (session 51's producer before the
    index ring)."""
    built = build(str(GW), model, {"T": T, "R": 1000}, {"wgrad_index_ring": "false"})
    _is_wgrad(built)
    result = ExactChecker(built.model, built.sizes, seed=5).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("model", ["WGRAD", "WGRAD-BF16", "WGRAD-P", "WGRAD-P-BF16"])
@pytest.mark.parametrize("tile", [{}, {"bm": "64", "warps_m": "1"}])
def test_the_persistent_walk_passes_the_exact_check(model, tile):
    """`wgrad_persistent`: the resident blocks walk every group's tiles, the ring and the index ring running on from
    one item to the next (session 52, written without a GPU). 80 groups of 4 tiles (2 × 2 at 128 columns): 320 work
    items, more than an H200's 132 blocks, so each block walks two or three, some of them empty."""
    built = build(str(GW), model, {"T": T, "R": 4000, "G": 80}, {"wgrad_persistent": "true", **tile})
    _is_wgrad(built)
    assert built.plan.kernels[0].wgrad_persistent
    result = ExactChecker(built.model, built.sizes, seed=7).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()


@pytest.mark.parametrize("name", list(COUNTS))
@pytest.mark.parametrize("tile", [{}, {"bn": "256", "stages": "3", "wgrad_copy": "cp.async"}, {"bm": "64", "warps_m": "1"},
                                  {"wgrad_copy": "registers"}, {"wgrad_persistent": "false"}])
def test_an_f32_a_bf16_cannot_hold_is_carried_exactly_by_its_two_parts(name, tile):
    """A of values i + j/256 (hi = bf16(a) loses them, hi + lo holds them; every product and partial sum exact in
    f32) times the row's factor: only a kernel that drops or misplaces a part, a row or a group differs."""
    counts = COUNTS[name]
    rows = sum(counts)
    built = build(str(GW), "WGRAD-P", {"T": T, "R": rows}, tile)
    _is_wgrad(built)
    g = torch.Generator().manual_seed(rows)
    dy = (torch.randint(-3, 4, (T, M), generator=g) + torch.randint(-127, 128, (T, M), generator=g) / 256.0).float()
    x = torch.randint(-3, 4, (T, N), generator=g).bfloat16().cuda()
    p = torch.randint(-2, 3, (rows,), generator=g).float().cuda()
    o0 = torch.randint(-3, 4, (G, M, N), generator=g).float().cuda()
    ix = torch.randint(0, T, (rows,), generator=g).int().cuda()
    e = torch.repeat_interleave(torch.arange(G), torch.tensor(counts)).int().cuda()
    out = built.compiled(DY=dy.cuda(), X=x, P=p, O=o0.clone(), IX=ix, E=e)
    out = (out["O"] if isinstance(out, dict) else out).double()
    torch.cuda.synchronize()
    ref = o0.double().clone()
    a = dy.cuda().double()[ix.long()] * p.double()[:, None]
    b = x.double()[ix.long()]
    for grp in range(G):
        sel = e.long() == grp
        ref[grp] += a[sel].T @ b[sel]
    assert torch.equal(out, ref), f"{int((out != ref).sum())} of {ref.numel()} elements differ"
