"""Shared-memory operand maps (habu/lower/layouts.py) executed by the finite-field check
(habu/prove/smem_route.py) against the PTX ISA's ldmatrix and m16n8k16 operand layouts."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from habu.lower import lower_plan
from habu.lower.fragments import A_OPERAND, B_OPERAND
from habu.lower.layouts import (
    FmaOperands,
    LdmatrixRead,
    MmaSyncOperands,
    SmemTile,
    WgmmaOperands,
    ldmatrix_read,
)
from habu.prove.fragments import ldmatrix_elements, mma_operand_position, wgmma_kmajor_addresses
from habu.prove.smem_route import route_key, route_of
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

GG = {"M": 300, "N": 200, "K": 520}


def lowering(example: str, model: str, sizes: dict[str, int], pins: dict[str, str], target: str = "sm_80"):
    m = load_program(ROOT / "examples" / example).models[model].with_sizes(sizes)
    plan = default_plan(m, TARGETS[target], sizes, pins)
    return next(lw for lw in lower_plan(m, plan) if hasattr(lw, "operands"))


def test_mma_operand_layouts_are_the_isa_tables():
    """PTX ISA, "Matrix fragments for mma.m16n8k16": lane 5 is groupID 1, threadID_in_group 1."""
    a_row, a_col = mma_operand_position("A")
    assert (a_row[5, 0, 0], a_col[5, 0, 0]) == (1, 2)  # a0
    assert (a_row[5, 1, 1], a_col[5, 1, 1]) == (9, 3)  # a3: row groupID + 8
    assert (a_row[5, 3, 1], a_col[5, 3, 1]) == (9, 11)  # a7: row + 8, column + 8
    b_k, b_n = mma_operand_position("B")
    assert (b_k[5, 0, 1], b_n[5, 0, 1]) == (3, 1)  # b1
    assert (b_k[5, 1, 0], b_n[5, 1, 0]) == (10, 1)  # b2: k + 8


def test_ldmatrix_gives_rows_or_their_transpose():
    rows = np.arange(32) * 8  # a dense 8x8 matrix per 8 lanes
    plain = ldmatrix_elements(rows, 1, False)
    trans = ldmatrix_elements(rows, 1, True)
    t = np.arange(32)
    for h in (0, 1):
        assert np.array_equal(plain[:, 0, h], 8 * (t // 4) + 2 * (t % 4) + h)
        assert np.array_equal(trans[:, 0, h], 8 * (2 * (t % 4) + h) + t // 4)


@pytest.mark.parametrize("operand,kmajor", [("A", True), ("A", False), ("B", True), ("B", False)],
                         ids=["A-ldmatrix.x4", "A-ldmatrix.x4.trans", "B-ldmatrix.x2", "B-ldmatrix.x2.trans"])
def test_ldmatrix_lane_maps_fill_the_mma_operand_registers(operand, kmajor):
    """The lane -> row-address map of each mma.sync operand read (habu.lower.layouts.ldmatrix_read, from
    the register placement in habu.lower.fragments), run through the PTX ISA's ldmatrix table, puts in
    every (lane, register, half) the element the m16n8k16 operand table says it holds: A stored [m][k]
    (plain) or [k][m] (.trans), B stored [n][k] (plain) or [k][n] (.trans)."""
    fragment = A_OPERAND if operand == "A" else B_OPERAND
    mn = 16 if operand == "A" else 8
    cols = mn if not kmajor else 16  # a dense stored tile: rows along mn (k-contiguous) or along k
    tile = SmemTile(16 if not kmajor else mn, cols, 2, 0, not kmajor)
    read = ldmatrix_read(fragment, kmajor, tile)
    assert (read.matrices, read.trans) == (fragment.matrices, not kmajor)
    lane = np.arange(32)
    rows, cols_ = read.lane_offset(lane)
    got = ldmatrix_elements(rows * tile.row_elems + cols_, read.matrices, read.trans)
    stored_row, stored_col = got // tile.row_elems, got % tile.row_elems
    got_mn, got_k = (stored_col, stored_row) if not kmajor else (stored_row, stored_col)
    r, q = mma_operand_position(operand)
    want_mn, want_k = (r, q) if operand == "A" else (q, r)
    assert np.array_equal(got_mn, want_mn) and np.array_equal(got_k, want_k)


def test_ldmatrix_trans_lanes_of_an_mn_major_a_are_the_ptx_rows():
    """ldmatrix.x4.trans of A stored [k][m]: lanes 0-7 give k rows 0-7 at m 0 (matrix 0: a0a1), lanes 8-15
    the same k rows at m 8 (a2a3), lanes 16-23 k rows 8-15 at m 0 (a4a5), lanes 24-31 at m 8 (a6a7)."""
    read = ldmatrix_read(A_OPERAND, False, SmemTile(16, 16, 2, 0, True))
    rows, cols = read.lane_offset(np.arange(32))
    assert list(rows) == [*range(8), *range(8), *range(8, 16), *range(8, 16)]
    assert list(cols) == [0] * 8 + [8] * 8 + [0] * 8 + [8] * 8
    assert A_OPERAND.block(1) == (1, 0) and A_OPERAND.block(2) == (0, 1)


def test_a_wrong_trans_lane_map_is_caught_by_the_ptx_table():
    """The same map with its column groups not wrapped (lanes 16-31 point 16 and 24 columns over) puts
    other elements in a4..a7: the table check fails."""
    tile = SmemTile(16, 32, 2, 0, True)
    good = ldmatrix_read(A_OPERAND, False, tile)
    bad = LdmatrixRead(4, True, 8, 4, tile, row_blocks=2)
    r, q = mma_operand_position("A")
    for read, expected in ((good, True), (bad, False)):
        rows, cols = read.lane_offset(np.arange(32))
        got = ldmatrix_elements(rows * tile.row_elems + cols, 4, True)
        matches = np.array_equal(got % tile.row_elems, r) and np.array_equal(got // tile.row_elems, q)
        assert matches == expected


def test_wgmma_kmajor_addresses_are_the_128_byte_swizzled_rows():
    """Rows of 128 bytes, 8-row atoms 1024 bytes apart, chunk ^= row % 8: what TMA writes."""
    addr = wgmma_kmajor_addresses(32, 16, 16, 1024, 128)  # the second k step of a K-major tile
    tile = SmemTile(16, 64, 2, 128)
    for r in range(16):
        for k in range(16):
            assert addr[r, k] == tile.byte_offset(r, 16 + k)


def test_the_128_byte_swizzle_is_the_device_header_pattern():
    """habu::swizzle128(row, chunk) = row * 128 + ((chunk ^ (row & 7)) << 4), the TMA/wgmma pattern."""
    tile = SmemTile(16, 64, 2, 128)
    for row in range(16):
        for chunk in range(8):
            assert tile.byte_offset(row, 8 * chunk) == row * 128 + ((chunk ^ (row & 7)) << 4)


@pytest.mark.parametrize("case", [
    ("ggemm.habu", "GGEMM", GG, {"mma": "mma.sync"}),
    ("ggemm.habu", "GGEMM", GG, {"mma": "mma.sync", "A": "ldg", "B": "ldg"}),
    ("ffn_skip.habu", "FFN-SKIP", {"B": 40, "D": 48, "H": 72}, {"mma": "mma.sync"}),  # B [k][n]: ldmatrix.trans
    ("ggemm.habu", "GGEMM", {"M": 130, "N": 70, "K": 33}, {"mma": "fma", "split_k": "2"}),
    ("ffn_skip.habu", "FFN-SKIP", {"B": 40, "D": 48, "H": 72}, {"mma": "fma"}),
    ("gemm.habu", "GEMM", {"M": 512, "N": 512, "K": 512}, {}, "sm_90a"),  # wgmma, TMA
    ("ggemm.habu", "GGEMM", GG, {}, "sm_90a"),  # wgmma, A by cp.async (gather)
    ("ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 511}, {"A": "ldg", "B": "ldg"}, "sm_90a"),
    ("ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 511}, {}, "sm_90a"),  # staged, then TMA
], ids=lambda c: f"{c[1]}-{'-'.join(c[3].values()) or 'default'}-{c[4] if len(c) > 4 else 'sm_80'}")
def test_the_emitted_maps_multiply_the_plain_tile_product(case):
    lw = lowering(*case)
    assert isinstance(lw.operands, MmaSyncOperands | FmaOperands | WgmmaOperands)
    route = route_of(lw)
    assert route.faults == () and route.identity
    assert route_key(lw) == "plain"


def test_regression_a_layout_mismatch_keys_its_own_field_check():
    """Plans whose maps route the plain product share one check (the search checks one plan per key);
    a plan whose store and read sides disagree must not share it."""
    lw = lowering("ggemm.habu", "GGEMM", GG, {"mma": "mma.sync"})
    ops = lw.operands
    assert isinstance(ops, MmaSyncOperands)
    bad = replace(lw, operands=replace(ops, a_read=replace(ops.a_read, row_lanes=8)))
    assert not route_of(bad).identity
    assert route_key(bad) != "plain"


def test_a_copy_outside_its_buffer_is_a_fault():
    lw = lowering("ggemm.habu", "GGEMM", GG, {"mma": "mma.sync"})
    ops = lw.operands
    assert isinstance(ops, MmaSyncOperands)
    wide = replace(ops.a_tile, row_elems=ops.a_tile.row_elems + 64)
    route = route_of(replace(lw, operands=replace(ops, a_copy=replace(ops.a_copy, tile=wide))))
    assert any("outside it" in f for f in route.faults), route.faults


def test_a_misaligned_ldmatrix_row_is_a_fault():
    lw = lowering("ggemm.habu", "GGEMM", GG, {"mma": "mma.sync"})
    ops = lw.operands
    assert isinstance(ops, MmaSyncOperands)
    odd = replace(ops.a_tile, row_elems=ops.a_tile.row_elems + 1)  # rows 82 bytes apart
    both = replace(ops, a_copy=replace(ops.a_copy, vector=1, tile=odd), a_read=replace(ops.a_read, tile=odd),
                   a_tile=replace(ops.a_tile, rows=ops.a_tile.rows + 2))
    route = route_of(replace(lw, operands=both))
    assert any("16-byte aligned" in f for f in route.faults), route.faults


def test_regression_a_cp_async_a_beside_an_mn_major_b_is_emitted():
    """wgmma with B contiguous along n (TMA boxes) and A copied by threads: the producer copy printed its
    offsets only from the lowering's maps and asserted they existed (the lowering held none beside an
    MN-major B then; it holds them now, B's 64-column blocks and transposed descriptor included, and
    their route is the plain tile product)."""
    from habu.lower import lower_whole
    from habu.paths.emit import emit_lowered

    sizes = {"B": 256, "D": 512, "H": 1024}
    m = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"].with_sizes(sizes)
    plan = default_plan(m, TARGETS["sm_90a"], sizes, {"A": "cp.async"})
    lowered = lower_whole(m, plan)
    mn = [lw for lw in lowered.kernels if getattr(lw.kernel, "mma", None) == "wgmma"
          and lw.kernel.a_move == "cp.async" and lw.b.positions[-1].axis == "n"]
    assert mn and all(lw.operands.b_desc.mn_major and route_of(lw).identity for lw in mn)
    sources = [k.source for k in emit_lowered(lowered, plan, TARGETS["sm_90a"]).kernels]
    assert any("cp_async<16>(a_stage" in s for s in sources)


PV_T = """3 EXTENT: #B  72 EXTENT: #I  80 EXTENT: #D  72 EXTENT: #J
bf16 TENSOR: P ( #B #J #I )  bf16 TENSOR: V ( #B #J #D )  f32 TENSOR: O ( #B #I #D )
MODEL: PV-T  O[b i d] = Σ j P[b j i] · V[b j d] ;
"""


@pytest.mark.parametrize("tile", ["64x128x64", "128x128x32"])
def test_regression_an_m_major_a_on_mma_sync_is_read_by_ldmatrix_trans_without_a_copy(tile):
    """P stored [b j i] (A contiguous along m) on mma.sync: staged [BK][BM+8] as stored (no staging pass,
    no transposing copy) and read by ldmatrix.x4.trans; the route is the plain tile product. The route
    counted the block's rows from A's copy as if it ran along k (bm = BK): at 128x128x32 it was not the
    identity, though every warp multiplied the right elements."""
    from habu.spec.parser import parse_text

    model = parse_text(PV_T, "pv_t.habu").models["PV-T"]
    plan = default_plan(model, TARGETS["sm_80"], {}, {"mma": "mma.sync", "tile": tile})
    (lw,) = lower_plan(model, plan)
    ops = lw.operands
    assert isinstance(ops, MmaSyncOperands) and lw.pre == () and lw.a.tensor == "P"
    assert ops.a_read.trans and ops.a_tile.k_rows and ops.a_tile.rows == lw.bk and not ops.a_copy.k_inner
    route = route_of(lw)
    assert route.faults == () and route.identity
