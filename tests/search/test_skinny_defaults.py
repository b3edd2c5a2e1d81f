"""Skinny contractions (decode: 1 to 128 tokens through a layer's weights, issue 20 §2): the analytic
default takes 64-row tiles, narrows them (or splits K where the output allows) until enough blocks
stream the weights, and deepens the pipeline; the plans it makes are proven (rules + the
finite-field check) and compile, ragged token counts included; the search space holds the narrow
shapes."""

from __future__ import annotations

import pytest

from habu.emit_cuda.nvrtc import compile_cuda, resources_of
from habu.paths import path_for, region_space
from habu.paths.contraction import (
    CLUSTER_SPLIT_ROWS,
    SKINNY_BLOCKS_PER_SM,
    SKINNY_FILL,
    SKINNY_MIN_K_TILES,
    SKINNY_ROWS,
    SKINNY_SPLIT_WIDTH,
    ContractionPath,
)
from habu.paths.emit import emit
from habu.paths.wgmma import SWAP_ROWS
from habu.plan.patterns import default_regions
from habu.plan.plan import ContractionKernel
from habu.prove import prove
from habu.prove.rules import failures, obligations
from habu.search.space import concrete_sizes, default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT, parse

H100 = TARGETS["sm_90a"]

# a Linear with its weight stored (in, out) as torch's `x @ W` reads it: B contiguous along n
LINEAR_KN = """
16 EXTENT: #M
4096 EXTENT: #N
4096 EXTENT: #K
bf16 TENSOR: X ( #M #K )
bf16 TENSOR: W ( #K #N )
bf16 TENSOR: Y ( #M #N )
MODEL: LINEAR-KN  Y[m n] = Σ k X[m k] · W[k n] ;
"""


def _model(kind: str):
    if kind == "kn":
        return parse(LINEAR_KN).models["LINEAR-KN"]
    example, name = {"gemm": ("gemm.habu", "GEMM"), "ggemm": ("ggemm.habu", "GGEMM")}[kind]
    return load_program(ROOT / "examples" / example).models[name]


def _contraction(plan) -> ContractionKernel:
    (k,) = [k for k in plan.kernels if isinstance(k, ContractionKernel)]
    return k


def assert_skinny(model, sizes: dict[str, int], k: ContractionKernel, target=H100) -> None:
    """The default of a skinny contraction: 64-row tiles, one of the path's skinny widths, enough
    blocks to stream the weights (or the narrowest width), a split only where the output is f32, a
    deep ring, and no rule broken."""
    path = path_for(k)
    assert isinstance(path, ContractionPath)
    if sizes["M"] <= SWAP_ROWS and k.mma == "wgmma":
        assert_swapped(sizes, k, target)
        return
    assert not k.swap_ab
    facts_widths = path.skinny_widths(_facts(model, sizes, target))
    m, n, k_depth = sizes["M"], sizes["N"], sizes["K"]
    assert k.mma == "wgmma" and k.tile_k == 64
    assert k.tile_m == 64 or (k.tile_m == 128 and m > 64)  # 128 rows: two warpgroups share B's tiles
    assert k.tile_n >= min(m, k.tile_m)  # A's re-reads at most B's bytes
    assert k.tile_n in facts_widths or k.split_reduce == "cluster"
    tiles = -(-m // k.tile_m) * -(-n // k.tile_n)
    f32_out = model.tensor(model.outputs[0].name).dtype.name == "f32"
    if k.split_reduce == "cluster":  # the skinny tile halved and split by a cluster of 2 (`skinny_cluster_split`)
        ((_bm, base_n, _bk), _w, _s), _split = path.skinny_schedule(_facts(model, sizes, target), target, f32_out)
        assert m <= CLUSTER_SPLIT_ROWS and k.split_k == 2 and k.tile_n == base_n // 2
        assert -(-m // k.tile_m) * -(-n // base_n) < SKINNY_FILL * target.sm_count and tiles * 2 <= target.sm_count
        assert k.store == "direct" and not k.persistent
    elif f32_out:  # tiles at most SKINNY_SPLIT_WIDTH wide (the widest that fills a wave, else the widest)
        # split until one wave, each split at least SKINNY_MIN_K_TILES k tiles deep
        allowed = [w for w in facts_widths if min(m, k.tile_m) <= w <= SKINNY_SPLIT_WIDTH]
        assert k.tile_n in allowed and (tiles >= SKINNY_FILL * target.sm_count or k.tile_n == allowed[0])
        assert k.split_k == 1 or tiles * k.split_k <= SKINNY_BLOCKS_PER_SM * H100.sm_count
        assert tiles * k.split_k * 2 > SKINNY_BLOCKS_PER_SM * H100.sm_count or -(-k_depth // 64) < 2 * SKINNY_MIN_K_TILES * k.split_k
    else:  # the widest tiles that fill a wave, or the narrowest allowed
        assert k.split_k == 1
        narrower = [w for w in facts_widths if min(m, k.tile_m) <= w < k.tile_n]
        assert tiles >= SKINNY_FILL * target.sm_count or not narrower
        wider = [w for w in facts_widths if w > k.tile_n]
        assert not wider or -(-m // k.tile_m) * -(-n // wider[-1]) < SKINNY_FILL * target.sm_count
        if k.tile_m == 64 and m > 64:  # 128-row tiles did not fill a wave
            assert -(-n // max(w for w in facts_widths if w >= 128)) < SKINNY_FILL * target.sm_count
    assert k.stages * k.tile_n * 64 * 2 >= 64 * 1024  # at least 64 KB of weights in flight per block


def assert_swapped(sizes: dict[str, int], k: ContractionKernel, target=H100) -> None:
    """The default of a product of at most SWAP_ROWS tokens, transposed (`swap_ab`): the weights along 64 or 128
    tile rows (128 where those tiles fill a wave), the tokens in one 16- or 32-wide column of tiles, split by a
    cluster of 2 where 64-row tiles leave half the SMs idle and the k loop is long, at least 64 KB of weights in
    flight per block, direct stores."""
    m, n, depth = sizes["M"], sizes["N"], sizes["K"]
    assert k.swap_ab and k.mma == "wgmma" and k.tile_k == 64 and k.store == "direct" and not k.persistent
    assert k.tile_n == (16 if m <= 16 else 32)
    tiles_128 = -(-n // 128)
    assert k.tile_m == (128 if tiles_128 >= SKINNY_FILL * target.sm_count else 64)
    tiles = -(-n // k.tile_m)
    split = (tiles < SKINNY_FILL * target.sm_count and 2 * tiles <= target.sm_count
             and -(-depth // 64) >= 2 * SKINNY_MIN_K_TILES)
    assert (k.split_k, k.split_reduce) == ((2, "cluster") if split else (1, "atomic"))
    assert k.stages * k.tile_m * 64 * 2 >= 64 * 1024
    assert not k.a_ahead  # (these models' tokens are inputs: no earlier kernel to start ahead of)


def _facts(model, sizes, target):
    from habu.paths.contraction import ContractionFacts

    (region,) = default_regions(model)
    return ContractionFacts.of(model, region, target, concrete_sizes(model, sizes))


@pytest.mark.parametrize("kind", ["gemm", "ggemm", "kn"])
@pytest.mark.parametrize("m", [1, 16, 64, 128])
@pytest.mark.parametrize("n,k", [(4096, 4096), (4096, 14336), (14336, 4096), (14336, 14336)])
def test_the_default_of_a_skinny_contraction_is_narrow_deep_and_fills_the_gpu(kind, m, n, k):
    model = _model(kind)
    sizes = {"M": m, "N": n, "K": k}
    bound = model.with_sizes(sizes)
    plan = default_plan(bound, H100, sizes)
    assert_skinny(bound, sizes, _contraction(plan))
    assert not failures(obligations(bound, plan, sizes))


def test_regression_ffn_skip_at_16_tokens_took_128_row_tiles_for_its_first_gemm():
    """H200, 2026-12-01: FFN-SKIP at 16 tokens took 123 µs, slower than at 128 (92 µs): its first GEMM
    ran 128x128 tiles (112 blocks, 5 stages) for 16 rows."""
    model = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"]
    for tokens in (16, 128):
        plan = default_plan(model.with_sizes({"B": tokens}), H100, {"B": tokens})
        first, second = (k for k in plan.kernels if isinstance(k, ContractionKernel))
        if tokens <= SWAP_ROWS:  # transposed: 128 weight columns by 16 tokens a tile
            assert first.swap_ab and (first.tile_m, first.tile_n) == (128, 16)
            # the down projection's weights stream while the first GEMM runs (its tokens are that GEMM's output)
            assert not first.a_ahead and second.a_ahead
            assert -(-14336 // first.tile_m) >= SKINNY_FILL * H100.sm_count
            assert first.stages * first.tile_m >= 512 and second.stages * second.tile_m >= 512  # >= 64 KB of W
            continue
        assert first.tile_m == min(tokens, 128) if tokens > 64 else first.tile_m == 64
        assert -(-tokens // first.tile_m) * -(-14336 // first.tile_n) >= SKINNY_FILL * H100.sm_count
        assert first.stages * first.tile_n >= 512 and second.stages * second.tile_n >= 512  # >= 64 KB of W


def test_wide_problems_keep_the_wide_default():
    model = _model("gemm")
    sizes = {"M": SKINNY_ROWS + 1, "N": 4096, "K": 4096}
    k = _contraction(default_plan(model.with_sizes(sizes), H100, sizes))
    assert k.tile_m == 128


def test_without_wgmma_the_skinny_default_is_mma_sync_with_narrow_tiles():
    model = _model("gemm")
    sizes = {"M": 16, "N": 4096, "K": 4096}
    k = _contraction(default_plan(model.with_sizes(sizes), TARGETS["sm_80"], sizes))
    assert (k.mma, k.tile_m, k.tile_n, k.tile_k, k.warps) == ("mma.sync", 32, 32, 64, 4)


def test_the_search_space_of_a_skinny_contraction_holds_narrow_deep_tiles_and_split_8():
    model = _model("ggemm")
    sizes = {"M": 64, "N": 4096, "K": 4096}
    bound = model.with_sizes(sizes)
    (region,) = default_regions(bound)
    space = {(v.mma, v.tile_m, v.tile_n, v.stages, v.split_k)
             for v in region_space(bound, region, H100, concrete_sizes(bound, sizes))}
    for shape in [("wgmma", 64, 16, 12, 1), ("wgmma", 64, 32, 8, 2), ("wgmma", 64, 64, 12, 8),
                  ("mma.sync", 32, 32, 8, 1)]:
        assert shape in space, shape


# M = 1, 17, 100: tails of a 64-row tile (a ragged last tile, most rows masked)
@pytest.mark.parametrize("kind,sizes", [
    ("ggemm", {"M": 1, "N": 4096, "K": 4096}),
    ("ggemm", {"M": 17, "N": 4096, "K": 14336}),
    ("gemm", {"M": 100, "N": 14336, "K": 4096}),
    ("kn", {"M": 17, "N": 4096, "K": 14336}),
    ("kn", {"M": 1, "N": 14336, "K": 4096}),
])
def test_skinny_defaults_are_proven_and_compile(kind, sizes):
    model = _model(kind).with_sizes(sizes)
    plan = default_plan(model, H100, sizes)
    assert_skinny(model, sizes, _contraction(plan))
    proof = prove(model, plan, sizes, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate
    kernels = emit(proof, H100).kernels
    source = "\n".join(k.source for k in kernels)
    compiled = compile_cuda(source, kernels[0].name, H100.name)
    for k in kernels:
        res = resources_of(compiled.log, k.name)
        assert not res.spills and res.registers > 0, (k.name, res)


def test_regression_a_b_ahead_pin_on_a_transposed_default_left_both_sides_ahead():
    """GPU run, 2026-12-04: `--pin b_ahead=true` on FFN-SKIP at 17 tokens and RMSNorm+Linear at 16 kept the
    transposed default's a_ahead too, and the plan was refused ("one operand's boxes go ahead"). A side pinned
    ahead now takes the other side back unless that is pinned too."""
    for example, name, sizes in (("ffn_skip", "FFN-SKIP", {"B": 17}), ("rmsnorm_linear", "RMSNORM-LINEAR", {"T": 16})):
        model = load_program(ROOT / "examples" / f"{example}.habu").models[name].with_sizes(sizes)
        plan = default_plan(model, H100, sizes, {"b_ahead": "true"})
        kernels = [k for k in plan.kernels if isinstance(k, ContractionKernel)]
        assert any(k.b_ahead for k in kernels) and not any(k.a_ahead for k in kernels)
        assert not failures(obligations(model, plan, sizes))
        both = default_plan(model, H100, sizes, {"b_ahead": "true", "a_ahead": "true"})
        assert failures(obligations(model, both, sizes))  # both pinned: refused, as pinned


def test_regression_a_swap_pin_on_a_tma_store_default_kept_the_tma_store():
    """FFN-SKIP at 128 tokens: the default stores its tiles by TMA; `--pin swap_ab=true` kept that store and the
    plan was refused (a TMA box holds rows along the kernel's n, the tokens once transposed). A swap pin now
    brings direct stores unless a store pin is given."""
    sizes = {"B": 128}
    model = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"].with_sizes(sizes)
    assert all(k.store == "tma" for k in default_plan(model, H100, sizes).kernels if isinstance(k, ContractionKernel))
    plan = default_plan(model, H100, sizes, {"swap_ab": "true", "tile": "128x128x64", "stages": "5"})
    kernels = [k for k in plan.kernels if isinstance(k, ContractionKernel)]
    assert all(k.swap_ab and k.store == "direct" for k in kernels)
    assert not failures(obligations(model, plan, sizes))
    kept = default_plan(model, H100, sizes, {"swap_ab": "true", "tile": "128x128x64", "store": "tma"})
    assert failures(obligations(model, kept, sizes))  # the store pinned: refused, as pinned


def test_the_search_space_of_a_14336_wide_product_holds_112_wide_tiles_where_b_is_k_major():
    """`O[b h] = Σ d A[b d]·W[h d]` at 128 tokens and #H 14336 (FFN-SKIP's dT3): 128 × 112 tiles make 128 blocks,
    not 112 (cuBLAS's choice for it); the tile is proven. An n-major B (`x @ W`) is read by TMA in 64-column
    boxes: the rules refuse that tile there."""
    sizes = {"M": 128, "N": 14336, "K": 4096}
    bound = _model("gemm").with_sizes(sizes)
    (region,) = default_regions(bound)
    assert any(v.mma == "wgmma" and (v.tile_m, v.tile_n, v.b_move) == (128, 112, "tma")
               for v in region_space(bound, region, H100, concrete_sizes(bound, sizes)))
    plan = default_plan(bound, H100, sizes, {"tile": "128x112x64"})
    assert _contraction(plan).tile_n == 112
    proof = prove(bound, plan, sizes, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate
    kn = _model("kn").with_sizes(sizes)
    refused = default_plan(kn, H100, sizes, {"tile": "128x112x64"})
    assert "supported-path" in {o.rule.name for o in failures(obligations(kn, refused))}
