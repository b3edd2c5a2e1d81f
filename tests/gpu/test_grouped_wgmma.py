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


def test_the_wgmma_loop_passes_the_exact_check():
    rows = 1000
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


@pytest.mark.parametrize("store_vector", ["2", "4"])
def test_the_combine_epilogue_on_the_wgmma_loop_passes_the_exact_check_and_adds_repeated_tokens(store_vector):
    """The scatter epilogue by float2 atomic adds (store_vector 2) and by float4 ones after the lanes' trade
    (store_vector 4: `WgmmaMainLoop.quad_source`)."""
    counts = GROUPINGS["empty-first-inner-last-and-longer-than-a-tile"]
    rows = sum(counts)
    built = build(str(GW), "COMBINE", {"T": 50, "R": rows}, {"family": "grouped", **WGMMA, "store_vector": store_vector})
    _is_wgmma(built)
    assert built.plan.kernels[0].store_vector == int(store_vector)
    assert ("reinterpret_cast<float4*>" in built.compiled.kernel_set.members[0][1].kernels[0].source) == \
        (store_vector == "4")
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


@pytest.mark.parametrize("split,tile", [("consumers", {}), ("producer", {}), ("consumers", {"bm": "64", "warps_m": "1"}),
                                        ("consumers", {"stages": "2"})])
def test_an_f32_a_bf16_cannot_hold_is_carried_exactly_by_its_two_parts_on_the_wgmma_loop(split, tile):
    """The combine of tests/data/grouped_scatter.habu with an f32 A of values m/256 (hi = bf16(a) loses them,
    hi + lo holds them; every product and partial sum exact in f32): only a kernel that drops or misplaces
    the low parts' tile differs; `split` (`a_split`): the producer splits A, or the consumers split it where it
    landed raw (session 51's default)."""
    gs, t, n, k, counts = ROOT / "tests" / "data" / "grouped_scatter.habu", 50, 200, 72, [64, 0, 0, 100, 1, 0, 70, 65]
    rows = sum(counts)
    built = build(str(gs), "COMBINE-F32", {"T": t, "R": rows}, {"family": "grouped", **WGMMA, "a_split": split, **tile})
    _is_wgmma(built)
    result = ExactChecker(built.model, built.sizes, seed=9).check(built.compiled, kept_types(built.plan))
    assert result.ok and result.applicable, result.reason()
    g = torch.Generator().manual_seed(4)
    a = (torch.randint(-3, 4, (rows, k), generator=g) + torch.randint(-127, 128, (rows, k), generator=g) / 256.0).float()
    w = torch.randint(-3, 4, (G, n, k), generator=g).bfloat16().cuda()
    p = torch.randint(-2, 3, (rows,), generator=g).float().cuda()
    y0 = torch.randint(-3, 4, (t, n), generator=g).float().cuda()
    ix = torch.randint(0, t, (rows,), generator=g).int().cuda()
    e = torch.repeat_interleave(torch.arange(G), torch.tensor(counts)).int().cuda()
    out = built.compiled(AF=a.cuda(), W=w, P=p, Y=y0.clone(), IX=ix, E=e)
    out = (out["Y"] if isinstance(out, dict) else out).double()
    torch.cuda.synchronize()
    contrib = p.double()[:, None] * torch.einsum("rk,rnk->rn", a.cuda().double(), w[e.long()].double())
    ref = y0.double().index_add(0, ix.long(), contrib)
    assert torch.equal(out, ref), f"{int((out != ref).sum())} of {ref.numel()} elements differ"


@pytest.mark.parametrize("pair,tile", [("fused", {"bm": "128", "warps_m": "2"}), ("fused", {"bm": "64", "warps_m": "1"}),
                                       ("fused", {"bm": "128", "warps_m": "2", "pair_wgmmas": "1"}),
                                       ("fused", {"bm": "128", "warps_m": "2", "pair_wgmmas": "1", "store_vector": "8"}),
                                       ("fused", {"bm": "64", "warps_m": "1", "store_vector": "8"})],
                         ids=["128-rows", "64-rows", "one-instruction", "one-instruction-vectors", "64-rows-vectors"])  # split: the gathered GEMM's and the combine's
def test_the_small_moe_ffn_on_the_wgmma_loop_matches_the_float64_reference(pair, tile):
    """Gate and up fused with SwiGLU in one kernel of two accumulators (act stored in bf16, packed pairs) and the
    combine (a bf16 A, float2 atomic adds) on the wgmma loop, in tiles of 128 rows (two consumer warpgroups) and
    of 64 (one: the small-batch tile); experts 0, 3 and 7 get no token; within the storage's tolerance."""
    from habu.timing.harness import compare, make_inputs, reference, tolerance
    from tests.gpu.test_moe import SMALL, routed_with_empty_experts

    tokens = 150
    built = build(str(SMALL), "MOE-FFN", {"T": tokens, "R": 2 * tokens},
                  {"family": "grouped", "pair": pair, **WGMMA, **tile})
    assert {k.bm for k in built.plan.kernels} == {int(tile["bm"])}
    assert built.plan.kernels[0].pair_wgmmas == int(tile.get("pair_wgmmas", "2"))  # gate, up: one n256 or two n128
    loops = [getattr(k, "main_loop", None) for k in built.plan.kernels]
    assert loops == (["wgmma", "wgmma", None, "wgmma"] if pair == "split" else ["wgmma", "wgmma"])
    inputs = make_inputs(built.model, built.sizes, seed=tokens)
    inputs["IX"], inputs["E"], _ = routed_with_empty_experts(tokens, 2, 8, {0, 3, 7}, tokens)
    ref = reference(built.model, inputs, built.sizes)["Y"]
    out = built.compiled(**{k: v.clone() for k, v in inputs.items()})
    torch.cuda.synchronize()
    g = compare(out, ref, tolerance(built.model, dict(built.plan.storage)))  # act in bf16
    assert g.unwritten == 0 and g.ok, f"relative error {g.rel_error:.2e}"
