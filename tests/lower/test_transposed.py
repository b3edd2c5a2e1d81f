"""Transposed operands: an A stored [k m] (contiguous along m) is read by TMA in 64-column boxes and
multiplied by wgmma with its transpose bit (as an n-contiguous B already was), not copied; where no
tensor-core path takes the layout, the default plan is one that does (never a refusal)."""

from __future__ import annotations

import pytest

from habu.lower import lower_plan
from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS

AT = """{M} EXTENT: #M  {N} EXTENT: #N  {K} EXTENT: #K
bf16 TENSOR: A ( #K #M )  bf16 TENSOR: B ( #K #N )  f32 TENSOR: O ( #M #N )
MODEL: G  O[m n] = Σ k A[k m] · B[k n] ;
"""
BATCHED_AT = """3 EXTENT: #B  {M} EXTENT: #M  {N} EXTENT: #N  {K} EXTENT: #K
bf16 TENSOR: A ( #B #K #M )  bf16 TENSOR: B ( #B #N #K )  bf16 TENSOR: O ( #B #M #N )
MODEL: G  O[b m n] = Σ k A[b k m] · B[b n k] ;
"""


def proven(text: str, target: str = "sm_90a", pins=None, **sizes):
    (model,) = parse_text(text.format(**sizes), "at.habu").models.values()
    plan = default_plan(model, TARGETS[target], {}, pins or {})
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() + ": " + o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    return model, plan


def test_regression_a_transposed_a_was_refused_by_the_default_plan():
    """`O[m n] = Σ k A[k m] · B[k n]` (/tmp/t27/at.habu): the default took mma.sync, whose rule
    supported-path refuses an A not contiguous along k, and `habu compile` failed."""
    _model, plan = proven(AT, M=256, N=256, K=512)
    (k,) = plan.kernels
    assert (k.mma, k.a_move, k.b_move) == ("wgmma", "tma", "tma")


def test_a_transposed_a_is_read_in_64_column_boxes_with_the_transpose_bit():
    model, plan = proven(AT, M=1000, N=776, K=520)
    (k,) = plan.kernels
    (lw,) = lower_plan(model, plan)
    a_load = lw.pipeline.load("A")  # type: ignore[union-attr]
    assert a_load.mn_major and a_load.box_rows == 64 and a_load.boxes == k.tile_m // 64
    (kernel,) = emit_plan(model, plan, TARGETS["sm_90a"]).kernels
    assert "p, 1, 1, 1, 1;" in kernel.source  # both transpose bits of wgmma.mma_async
    assert "tma_load_2d(a_stage + 8192u, &tm_A, full, (int)(m0 + 64)" in kernel.source
    maps = {p.tensor: p.tma for p in kernel.params if p.kind == "tensormap"}
    assert maps["A"].dims == ("M", "K") and maps["A"].box == (64, 64)


@pytest.mark.parametrize("target, a_move", [("sm_90a", "ldg"), ("sm_80", "cp.async")])
def test_where_wgmma_does_not_take_the_layout_the_default_is_mma_sync_with_ldmatrix_trans(target, a_move):
    """#M = 201: A's rows of 402 bytes are no TMA descriptor's (nor 16-byte cp.async rows: element copies);
    sm_80 has no wgmma. The SIMT path computed both; mma.sync now stages A as stored and reads it with
    ldmatrix.x4.trans (tests/lower/test_transposed_operands.py; GPU: tests/gpu/test_ldmatrix_trans.py)."""
    _, plan = proven(AT, target, M=201 if target == "sm_90a" else 256, N=136, K=72)
    assert (plan.kernels[0].mma, plan.kernels[0].a_move) == ("mma.sync", a_move)


def test_a_batched_transposed_a_with_odd_tails():
    model, plan = proven(BATCHED_AT, M=200, N=136, K=72)
    (k,) = plan.kernels
    assert (k.mma, k.a_move) == ("wgmma", "tma")
    (kernel,) = emit_plan(model, plan, TARGETS["sm_90a"]).kernels
    maps = {p.tensor: p.tma for p in kernel.params if p.kind == "tensormap"}
    assert maps["A"].dims == ("M", "K", "B") and maps["A"].box == (64, 64, 1)


@pytest.mark.parametrize("pins", [{"persistent": "true"}, {"mma": "fma"}, {"split_k": "2", "mma": "fma"}])
def test_pinned_paths_of_a_transposed_a(pins):
    proven(AT, pins=pins, M=200, N=136, K=200)


def test_an_mn_major_a_is_the_lowerings_and_the_route_runs_its_transposed_read():
    """After the merge of s27-derive17 into s27-batched's main: an A stored [k m] gets WgmmaOperands (BM/64
    blocks of [BK][64], TMA's 16-byte chunks along m, the transposed descriptor) like an n-contiguous B;
    the operand route runs them; slabs' blocks a half block apart on the read side, or a descriptor
    stepping half an 8-row atom along k, make it multiply other elements."""
    from dataclasses import replace

    from habu.lower.layouts import WgmmaOperands
    from habu.prove.smem_route import route_of, wgmma_route

    model, plan = proven(AT, M=1000, N=776, K=520)  # two consumer warpgroups: slabs in two blocks
    (lw,) = lower_plan(model, plan)
    ops = lw.operands
    assert isinstance(ops, WgmmaOperands)
    assert ops.a_desc.mn_major and ops.a_tile.k_rows and ops.a_tile.block_cols == 64 and not ops.a_copy.k_inner
    assert ops.a_start(0, 1, 0)[0] == ops.a_tile.block_rows * 128 and ops.bm == lw.bm
    assert route_of(lw).identity and not route_of(lw).faults
    (kernel,) = emit_plan(model, plan, TARGETS["sm_90a"]).kernels
    slab_bytes, k_bytes = ops.a_start(0, 1, 0)[0], ops.a_start(0, 0, 1)[1]  # A's descriptor, printed from them
    assert (f"habu::wgmma_desc_sw128_mn(a_stage + (habu::u32)((cw * {ops.slabs} + 0) * {slab_bytes}) + kk * {k_bytes}, "
            f"{ops.a_desc.lbo}u)") in kernel.source
    assert ops.slabs * ops.consumers > 1
    half_blocks = replace(ops, a_tile=replace(ops.a_tile, block_rows=ops.a_tile.block_rows // 2))  # copies keep theirs
    assert not wgmma_route(half_blocks).identity
    wrong_sbo = replace(ops, a_desc=replace(ops.a_desc, sbo=ops.a_desc.sbo // 2))
    assert not wgmma_route(wrong_sbo).identity
