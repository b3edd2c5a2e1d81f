"""How much of the emitted CUDA is printed from the lowering: the share of code lines that change when
the lowering changes.

A kernel line is *lowering-derived* when its text moves under at least one perturbation of the lowering
the finite-field check runs: a mask dropped or made inclusive, a stride taken from another extent, an
access's positions reversed, the k step doubled, the k loop shortened, the split mode, the combined
warps of a row reduction, a row kernel's thread map (lanes, rows, chunk stride, tail predicate, vector),
cache slots, pass order and register chunks, a map kernel's lane stride and vector, the k loop's pipeline
(stages, phases, arrival counts, expected bytes, TMA boxes), the shared-memory operand maps (swizzle,
padding, ldmatrix lane maps, copy vectors, warp grid; the wgmma descriptors' offsets and swizzle), the
wgmma TMA-store epilogue (boxes, column groups, slabs, buffer offsets and strides, swizzle), the column
kernel's thread map and partial slots (each stride and count one more), the block decode (a tile row
too many), each tile's origin, the k range's first tile, the accumulator's thread decode, the ring's
barrier addresses, the general kernel's thread map, a map lane's elements, a flat grid's extents
order and its decode's last step, the batch decode one batch on, a staging pass's block origin, threads,
lanes and shared slots. (Not the index width: it changes the type of nearly every line, not the arithmetic in it.)
Such a line is computed from objects the proof executed; a line that moves under none is fixed text of the emitter (instructions, barriers, declarations) or
arithmetic the lowering does not hold yet. Blank lines, comments, braces and `#pragma`s are not
counted.

    python -m habu.bench.derived_lines            # a table per path, over each example's default plan
                                                  # and pinned paths
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any

from habu.bench.derived_cases import CASES, EXAMPLES
from habu.bench.derived_plants_attention import (
    VECTOR_PLANTS,
    WGMMA_ATTENTION_OFFSETS,
    WGMMA_ATTENTION_PLANTS,
    planted_vectors,
)
from habu.lower import (
    ColumnLowering,
    ContractionLowering,
    GeneralLowering,
    GroupedLowering,
    LoweredPlan,
    MapLowering,
    RowLowering,
    lower_whole,
)
from habu.lower.access import Access, Bound, FlatGrid
from habu.lower.attention import AttentionLowering
from habu.lower.attention_wgmma import AttentionWgmmaLowering
from habu.lower.column_maps import ColumnPartials, ColumnThreadMap
from habu.lower.fragments import AccumulatorFragment
from habu.lower.grouped_mma import GroupedMmaLoop
from habu.lower.grouped_wgmma import WgmmaMainLoop
from habu.lower.layouts import FmaOperands, MmaSyncOperands, WgmmaOperands
from habu.lower.pipeline import CpAsyncRing, MbarrierRing, TmaOperandLoad
from habu.lower.staging import StageLowering, StageTile
from habu.lower.tma_store import TmaStoreEpilogue

_NOT_CODE = re.compile(r"^\s*($|//|#pragma|[{}]\s*$|}}\s*$)")
# a line of index arithmetic: an integer declared or assigned, an address formed from a pointer, a TMA
# coordinate, a loop bound or a predicate on coordinates
_INDEX = re.compile(r"\b(int|long long|habu::u32|unsigned|u32)\s+\w+(\[\w*\])?\s*=|\bp_\w+ \+ |\btma_(load|store|gather)"
                    r"|\bfor \(|\bif \(.*[<>]|\? .*:|\bscratch\[|\bblock_reduce<|\bsmem \+|swizzle")


@dataclass
class Measure:
    label: str
    lines: int  # code lines of the plan's kernels
    derived: int  # of them, lines that change when the lowering changes
    index_lines: int  # code lines of index arithmetic (integers, addresses, coordinates, bounds, predicates)
    index_derived: int  # of them, lines that change when the lowering changes
    refused: int  # perturbations the emitter refused (it reads those fields)

    @property
    def share(self) -> float:
        return self.derived / self.lines if self.lines else 0.0

    @property
    def index_share(self) -> float:
        return self.index_derived / self.index_lines if self.index_lines else 0.0


def _access_variants(acc: Access) -> Iterator[Access]:
    for i, b in enumerate(acc.masks):
        yield replace(acc, masks=acc.masks[:i] + acc.masks[i + 1:])
        yield replace(acc, masks=(*acc.masks[:i], Bound(b.axis, b.extent, not b.inclusive), *acc.masks[i + 1:]))
    for i, s in enumerate(acc.strides):
        other = tuple(e for e in acc.extents if e not in s)[:1] or ("__X",)
        yield replace(acc, strides=(*acc.strides[:i], s + other, *acc.strides[i + 1:]))
    if len(acc.positions) > 1:
        yield replace(acc, positions=tuple(reversed(acc.positions)))


def _variants(obj: Any) -> Iterator[Any]:
    """Every one-step perturbation of a lowering object (recursing into its accesses and stages)."""
    if isinstance(obj, Access):
        yield from _access_variants(obj)
        return
    if isinstance(obj, tuple):
        for i, item in enumerate(obj):
            for v in _variants(item):
                yield (*obj[:i], v, *obj[i + 1:])
        return
    if not is_dataclass(obj) or isinstance(obj, type):
        return
    for f in fields(obj):
        if f.name == "kernel":
            continue
        value = getattr(obj, f.name)
        if isinstance(value, Access | tuple) or (is_dataclass(value) and not isinstance(value, type)):
            for v in _variants(value):
                yield replace(obj, **{f.name: v})
    if isinstance(obj, ContractionLowering):
        # the raster order and grouping: the lowering's tile_of turns a block index into a tile with them
        other = "column" if obj.kernel.raster == "row" else "row"
        yield replace(obj, kernel=replace(obj.kernel, raster=type(obj.kernel.raster)(other)))
        yield replace(obj, kernel=replace(obj.kernel, group_m=1 if obj.kernel.group_m > 1 else 8))
        yield replace(obj, k_step=2 * obj.k_step)
        if obj.batch:  # the batch decode one batch on (batch z reads batch z + 1's coordinates)
            yield _with_override(obj, "batch_coordinates", lambda sup, z, *rest: sup(z + 1, *rest))
        if len(obj.batch) > 1:  # several batch axes: their order reversed, and their coordinates swapped
            yield replace(obj, batch=tuple(reversed(obj.batch)))
            yield _with_override(obj, "batch_coordinates",
                                 lambda sup, *args: dict(zip(sup(*args), reversed(sup(*args).values()), strict=True)))
        yield replace(obj, fragment=replace(obj.fragment, row_step=obj.fragment.row_step + 1,
                                            lanes_per_row=obj.fragment.lanes_per_row + 1))
        yield replace(obj, fragment=replace(obj.fragment, halves=obj.fragment.halves + 1))
        # the accumulator's thread decode (a thread's lane and warp within its warpgroup)
        yield replace(obj, fragment=replace(obj.fragment, warp_size=obj.fragment.warp_size // 2))
        yield replace(obj, split_mode="none" if obj.split_mode == "atomic" else "atomic")
        yield _shortened(obj)
        # the block decode and the k range's start: a tile row too many (the split and batch strides),
        # each tile's origin one tile on, the first k tile one late
        yield _with_override(obj, "tiles_m", lambda sup, s: sup(s) + 1)
        yield _with_override(obj, "tile_origin", lambda sup, tm, tn: sup(tm + 1, tn + 1))
        yield _with_override(obj, "k_range", lambda sup, split, s: (sup(split, s)[0] + 1, sup(split, s)[1]))
    yield from _pipeline_variants(obj)
    if isinstance(obj, MmaSyncOperands):
        yield from _operand_variants(obj)
    if isinstance(obj, FmaOperands):
        yield from _fma_operand_variants(obj)
    if isinstance(obj, WgmmaOperands):
        yield from _wgmma_operand_variants(obj)
    if isinstance(obj, TmaStoreEpilogue):
        yield from _tma_store_variants(obj)
    if isinstance(obj, ColumnLowering):  # the block decode: tile and split from the grid's other dimension
        yield _with_override(obj, "block", lambda sup, bx, by: sup(by, bx))
    if isinstance(obj, ColumnThreadMap | ColumnPartials):  # the column kernel's maps: each stride and count
        for f in fields(obj):
            yield replace(obj, **{f.name: getattr(obj, f.name) + 1})
    if isinstance(obj, RowLowering):
        yield replace(obj, combined_warps=obj.combined_warps + 1)
        yield replace(obj, reduce_mask=not obj.reduce_mask)
        # the thread map: lanes per row, rows per block, the stride between a thread's chunks, the tail
        m = obj.thread_map
        yield replace(obj, thread_map=replace(m, threads=m.threads + 32))
        yield replace(obj, thread_map=replace(m, rows=m.rows + 1))
        yield replace(obj, thread_map=replace(m, chunk_stride=m.chunk_stride + 1))
        yield replace(obj, thread_map=replace(m, end_inclusive=not m.end_inclusive))
        yield replace(obj, thread_map=replace(m, vector=2 * m.vector))
        if obj.cache is not None:  # the row cache's slots
            yield replace(obj, cache=replace(obj.cache, permuted=not obj.cache.permuted))
            yield replace(obj, cache=replace(obj.cache, lane_pad=obj.cache.lane_pad - 1))
        yield replace(obj, passes=tuple(reversed(obj.passes)))
        yield _more_register_chunks(obj)
    if isinstance(obj, MapLowering):
        yield replace(obj, lanes=replace(obj.lanes, lane_stride=obj.lanes.lane_stride + 1))
        yield replace(obj, lanes=replace(obj.lanes, vector=obj.lanes.vector + 1))
        # a lane's elements strided (element v of the lane at first + 2·v)
        yield replace(obj, lanes=_with_override(obj.lanes, "element", lambda sup, first, v: sup(first, 2 * v)))
    if isinstance(obj, GeneralLowering):
        yield _loops_shortened(obj)
        yield replace(obj, thread_map=replace(obj.thread_map, threads=obj.thread_map.threads + 32))
        yield replace(obj, thread_map=replace(obj.thread_map, per_thread=obj.thread_map.per_thread + 1))  # elements
        if obj.vector > 1:  # a vector's element j taken for element j + 1 (its index in the node's conditions)
            yield _with_override(obj, "lane_coordinates", lambda sup, coord, j: sup(coord, (j + 1) % obj.vector))
    if isinstance(obj, GroupedLowering):
        yield from _grouped_variants(obj)
    if isinstance(obj, AttentionLowering):
        yield from _attention_variants(obj)
    if isinstance(obj, StageLowering):  # a staging pass's block origin: each block one block on every way
        yield _with_override(obj, "origin", lambda sup, bx, by, bz, *rest: sup(bx + 1, by + 1, bz + 1, *rest))
        yield replace(obj, threads=2 * obj.threads)
    if isinstance(obj, StageTile):  # a tile pass's shape, lanes and shared slots, each one element on
        yield replace(obj, across=2 * obj.across)
        yield _with_override(obj, "load_lane", lambda sup, e: sup(e + 1))
        yield _with_override(obj, "store_lane", lambda sup, e: sup(e + 1))
        yield _with_override(obj, "slot", lambda sup, c, kk: sup(c, kk) + 1)
        yield _with_override(obj, "element_index", lambda sup, j, t, n: sup(j, t + 1, n))
        yield _with_override(obj, "steps", lambda sup, n: sup(n) - 1)
    if isinstance(obj, FlatGrid) and len(obj.extents) > 1:  # the flat index's decode: its divisors' order
        yield replace(obj, extents=tuple(reversed(obj.extents)))
    if isinstance(obj, FlatGrid) and obj.extents:  # the decode's last step reduced too (e0 = rest % #E0)
        yield _with_override(obj, "decode", lambda sup: (*sup()[:-1], (*sup()[-1][:2], "%", sup()[-1][3])))


# the grouped GEMM's maps, each planted one off (what `habu.prove.interp_grouped` runs): a tile's rows and
# columns, the k index and step count, a group's row tiles, the row tile within its group, the block's
# liveness and the row mask at the group's end; (method, planted result of the method as it was)
GROUPED_PLANTS: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("row", lambda sup, begin, m, i: sup(begin, m, i + 1)),
    ("column", lambda sup, nt, j: sup(nt, j + 1)),
    ("k_index", lambda sup, step, kk: sup(step, kk + 1)),
    ("k_steps", lambda sup, sizes: sup(sizes) - 1),
    ("m_tiles", lambda sup, lo, hi: sup(lo, hi) + 1),
    ("tile_in_group", lambda sup, mt, start: sup(mt, start) + 1),
    ("live", lambda sup, mt, total: sup(mt, total - 1)),
    ("row_inside", lambda sup, row, end: sup(row, end + 1)),
    ("group_end", lambda sup, g: sup(g) + 1),
    ("block_tile", lambda sup, bx, by: sup(by, bx)),
    ("grid", lambda sup, sizes: (sup(sizes)[0] + 1, sup(sizes)[1])),
)


def _grouped_variants(lw: GroupedLowering) -> Iterator[GroupedLowering]:
    for method, planted in GROUPED_PLANTS:
        if callable(getattr(type(lw), method, None)):  # (a map the lowering has)
            yield _with_override(lw, method, planted)
    if lw.mma is not None:
        yield from (replace(lw, mma=v) for v in _grouped_mma_variants(lw.mma))
    if lw.wgmma is not None:
        yield from (replace(lw, wgmma=v) for v in _grouped_wgmma_variants(lw.wgmma))
    if lw.epilogue_vectors is not None:  # the 16-byte epilogue's trade, as the attention's O vectors
        for method, planted in VECTOR_PLANTS:
            yield _with_property(lw, "epilogue_vectors", lambda qv, m=method, p=planted: planted_vectors(qv, m, p))


def _fragment_variants(f: AccumulatorFragment) -> Iterator[AccumulatorFragment]:
    """The accumulator map: a row step and lanes per row more, a row half more, the thread decode's warp halved."""
    yield replace(f, row_step=f.row_step + 1, lanes_per_row=f.lanes_per_row + 1)
    yield replace(f, halves=f.halves + 1)
    yield replace(f, warp_size=f.warp_size // 2)
    yield replace(f, col_step=f.col_step * 2)
    yield replace(f, pair=f.pair + 1)


def _grouped_mma_variants(loop: GroupedMmaLoop) -> Iterator[GroupedMmaLoop]:
    """The grouped mma.sync loop's maps perturbed: the warp grid, each stage tile's padding (copies
    together), each copy's vector and walk, each operand's word map (lanes per row, a register's block
    swapped), the accumulator map, the mma's k, the threads, the thread decode, the chunk a turn copies."""
    g = loop.grid
    yield replace(loop, grid=replace(g, along_m=g.along_m + 1, warp_rows=g.warp_rows + 16, warp_cols=g.warp_cols + 8))
    for side in ("a", "w"):
        tile, copy, read = (getattr(loop, f"{side}_{x}") for x in ("tile", "copy", "read"))
        other = replace(tile, row_elems=tile.row_elems + 8)
        yield replace(loop, **{f"{side}_tile": other, f"{side}_copy": replace(copy, tile=other)})
        yield replace(loop, **{f"{side}_copy": replace(copy, vector=copy.vector // 2)})
        yield replace(loop, **{f"{side}_copy": replace(copy, k_inner=not copy.k_inner)})
        yield replace(loop, **{f"{side}_read": replace(read, lanes_per_row=read.lanes_per_row * 2)})
        yield replace(loop, **{f"{side}_read": _with_override(read, "word", lambda sup, r: sup(r ^ 1))})
    for f in _fragment_variants(loop.fragment):
        yield replace(loop, fragment=f)
    yield replace(loop, mma_k=2 * loop.mma_k)
    yield replace(loop, threads=loop.threads + 32)
    yield replace(loop, warp_size=loop.warp_size // 2)
    yield _with_override(loop, "chunk", lambda sup, tid, q: sup(tid, q) + 1)


def _grouped_wgmma_variants(loop: WgmmaMainLoop) -> Iterator[WgmmaMainLoop]:
    """The grouped wgmma loop's own maps perturbed (its operands and ring are the contraction path's, perturbed
    there): the band, the tile decode, the warpgroup decode, the producer's copies of A, the accumulator map,
    an f32 A's low parts, a pair's second box and
    (one instruction over both boxes) where each product's columns lie in the accumulator."""
    yield replace(loop, band=loop.band + 1)
    yield _with_override(loop, "walk", lambda sup, b, nb, tiles: (sup(b, nb, tiles)[0], sup(b, nb, tiles)[1],
                                                                   sup(b, nb, tiles)[2] * 2))
    yield _with_override(loop, "producer_thread", lambda sup, tid: sup(tid) + 1)
    yield _with_override(loop, "tile_of", lambda sup, lin, gx, gy: sup(lin + 1, gx, gy))
    yield replace(loop, warpgroup_size=loop.warpgroup_size // 2)
    yield _with_override(loop, "consumer", lambda sup, wg: wg)
    yield _with_override(loop, "a_copy_row", lambda sup, ptid, j: sup(ptid, j) + 1)
    yield _with_override(loop, "a_copy_k", lambda sup, ptid: sup(ptid) + 8)
    for f in _fragment_variants(loop.fragment):
        yield replace(loop, fragment=f)
    if loop.lo_offset:
        yield replace(loop, lo_offset=loop.lo_offset + 1024)
    if loop.b2_offset:
        yield replace(loop, b2_offset=loop.b2_offset + 1024)
    if loop.one_pair_instruction:
        yield _with_override(loop, "pair_group", lambda sup, j, which: sup(j, 1 - which))


# the fused attention kernel's maps, each planted one off (what `habu.prove.interp_attention` runs): the
# block's query tile and batch element, the batch decode, a tile's rows and keys and their masks, the causal
# limits and the KV tiles visited, the open-tile test, the row tile of a warp's accumulators, the copies'
# chunks, the shared-memory layout, the buffer of a KV tile, the Q, K, V and P fragment maps
ATTENTION_PLANTS: tuple[tuple[str, Callable[..., Any]], ...] = (
    ("query_tile", lambda sup, x, sizes: sup(x, sizes) + 1),
    ("batch_flat", lambda sup, x, sizes: sup(x + 1, sizes)),
    ("batch_coords", lambda sup, flat, sizes: sup(flat + 1, sizes)),
    ("row", lambda sup, qt, t: sup(qt, t + 1)),
    ("row_inside", lambda sup, row, sizes: sup(row - 1, sizes)),
    ("key", lambda sup, kt, t: sup(kt, t + 1)),
    ("key_inside", lambda sup, key, sizes: sup(key - 1, sizes)),
    ("key_limit", lambda sup, qt, sizes, term: sup(qt, sizes, term) + 1),
    ("open_limit", lambda sup, qt, sizes, term: sup(qt, sizes, term) + 1),
    ("unmasked", lambda sup, kt, limit, sizes, both: sup(kt + 1, limit, sizes, both)),
    ("kv_tiles", lambda sup, limit, sizes, clamp: sup(limit, sizes, clamp) + 1),
    ("row_tile", lambda sup, warp, mi: sup(warp, mi + 1)),
    ("copy_chunk", lambda sup, chunk, width: sup(chunk + 1, width)),
    ("q_smem", lambda sup, row, col: sup(row + 1, col)),
    ("k_smem", lambda sup, stage, row, col: sup(stage, row + 1, col)),
    ("v_smem", lambda sup, stage, row, col: sup(stage, row + 1, col)),
    ("stage_of", lambda sup, kt: sup(kt + 1)),
    ("lane_group", lambda sup, lane: sup(lane + 1)),
    ("q_fragment", lambda sup, warp, lane, kk, reg: sup(warp, lane, kk, reg) + 1),
    ("k_rows", lambda sup, stage, lane, kk, jp: sup(stage, lane + 1, kk, jp)),
    ("v_rows", lambda sup, stage, lane, kk, dp: sup(stage, lane + 1, kk, dp)),
    ("p_fragment", lambda sup, kk, reg: sup(kk, (reg + 1) % 4)),
    ("copy_chunks", lambda sup, rows, width: sup(rows, width) - 1),
    ("staged_column", lambda sup, col: sup(col + 1)),
    ("register_parts", lambda sup, q: tuple(reversed(sup(q)))),
    ("b_registers", lambda sup, half: tuple(reversed(sup(half)))),
    ("next_tile", lambda sup, kt: sup(kt + 1)),
    ("first_tile", lambda sup, *split: sup(*split) + 1),
    # split-KV: the block decode, the splits' last tiles, the partials' slots, the counters, the combine
    ("block_split", lambda sup, x, sizes: tuple(reversed(sup(x, sizes)))),
    ("end_tile", lambda sup, split, tiles: sup(split + 1, tiles)),
    ("splits", lambda sup, sizes: sup(sizes) + 1),
    ("partial_slot", lambda sup, split, flat, row, sizes: sup(split, flat, row + 1, sizes)),
    ("partial_offset", lambda sup, split, flat, row, d, sizes: sup(split, flat, row, d + 1, sizes)),
    ("counter_slot", lambda sup, flat, qt, sizes: sup(flat, qt + 1, sizes)),
    ("arrivals", lambda sup, sizes: sup(sizes) + 1),
    ("combine_element", lambda sup, e: sup(e + 1)),
    ("combine_exponent", lambda sup, m_split, m_all, ops: ops.sub(m_all, m_split)),
    # the KV tiles sliced over warps and their merge; the K/V buffers' prologue and prefetch (session 31)
    ("key_slice", lambda sup, warp: sup(warp + 1)),
    ("slice_key", lambda sup, warp, col: sup(warp, col + 1)),
    ("k_slice_rows", lambda sup, warp, stage, lane, kk, jp: sup(warp, stage, lane, kk, jp) + 1),
    ("v_slice_rows", lambda sup, warp, stage, lane, kk, dp: sup(warp, stage, lane, kk, dp) + 1),
    ("merge_o", lambda sup, warp, t, d: sup(warp, t, d + 1)),
    ("merge_m", lambda sup, warp, t: sup(warp, t + 1)),
    ("merge_l", lambda sup, warp, t: sup(warp, t + 1)),
    ("merge_element", lambda sup, e: sup(e + 1)),
    ("merge_warp", lambda sup, t, s: sup(t, s + 1)),
    ("merge_exponent", lambda sup, m_slice, m_all, ops: ops.sub(m_all, m_slice)),
    ("row_writer", lambda sup, d: sup(d - 1)),
    ("prefetch_tile", lambda sup, kt: sup(kt) + 1),
    ("prologue_tile", lambda sup, first, p: sup(first, p + 1)),
    ("combine_pair", lambda sup, p, sizes: sup(p + 1, sizes)),
    ("combine_w", lambda sup, s, t: sup(s, t + 1)),
    ("combine_l", lambda sup, s, t, sizes: sup(s, t + 1, sizes)),
    ("prologue_limit", lambda sup, split, tiles, sizes: sup(split, tiles, sizes) + 1),
    ("combine_total", lambda sup, t, sizes: sup(t + 1, sizes)),
    ("counter_after", lambda sup, sizes: sup(sizes) + 1),
    ("combine_pairs", lambda sup, sizes: sup(sizes) - 1),
)
# the attention kernel's fragment loops: each trip count one short
ATTENTION_COUNTS = ("sets_per_warp", "qk_steps", "key_pairs", "score_groups", "pv_steps", "out_groups", "value_pairs",
                    "registers", "combine_count", "merge_count", "kv_warps", "kv_stages")


def _attention_variants(lw: AttentionLowering) -> Iterator[AttentionLowering]:
    for method, planted in ATTENTION_PLANTS:
        yield _with_override(lw, method, planted)
    if isinstance(lw, AttentionWgmmaLowering):  # the wgmma loop's own maps (habu/bench/derived_plants_attention.py)
        for method, planted in WGMMA_ATTENTION_PLANTS:
            yield _with_override(lw, method, planted)
        for name, delta in WGMMA_ATTENTION_OFFSETS:
            yield replace(lw, **{name: getattr(lw, name) + delta})
        if lw.out_vectors is not None:
            for method, planted in VECTOR_PLANTS:
                yield _with_property(lw, "out_vectors", lambda qv, m=method, p=planted: planted_vectors(qv, m, p))
    for count in ATTENTION_COUNTS:
        yield _with_property(lw, count, lambda n: n - 1)
    yield replace(lw, quad_offsets=lw.quad_offsets[:-1])
    yield replace(lw, fragment=replace(lw.fragment, row_step=lw.fragment.row_step + 1,
                                       lanes_per_row=lw.fragment.lanes_per_row + 1))
    yield replace(lw, fragment=replace(lw.fragment, warp_size=lw.fragment.warp_size // 2))
    yield replace(lw, fragment=replace(lw.fragment, col_step=lw.fragment.col_step + 1))


def _pipeline_variants(obj: Any) -> Iterator[Any]:
    """The k loop's pipeline: a stage more, the consumers reading the next stage, the state update's
    wrap and phase flip, each wait's phase parity inverted, the expected bytes halved, a barrier's arrival count off by one, a TMA box's k
    coordinate not advancing or its multicast mask losing a block, the cp.async prologue and wait
    depth off by one."""
    from habu.bench.mutants import _reads_next_stage

    if isinstance(obj, MbarrierRing):
        yield replace(obj, stages=obj.stages + 1)
        yield _reads_next_stage(obj)
        yield replace(obj, producer_parity=1 - obj.producer_parity)
        yield replace(obj, consumer_parity=1 - obj.consumer_parity)
        yield replace(obj, expect_tx=obj.expect_tx // 2)
        yield replace(obj, full_arrivals=obj.full_arrivals + 1)
        yield replace(obj, empty_arrivals=obj.empty_arrivals - 1)
        yield replace(obj, cluster=obj.cluster + 1)
        yield replace(obj, wrap=obj.wrap + 1)  # the state update (habu::ring_advance<wrap, flip>)
        yield replace(obj, flip=0)
        yield replace(obj, start_stage=1, start_phase=1)  # the state the ring starts from
        yield replace(obj, barrier_stride=obj.barrier_stride + 16, empty_offset=0)  # the barriers' addresses
        yield replace(obj, base=obj.base + 8)
    if isinstance(obj, TmaOperandLoad):
        yield replace(obj, k_step=0)
        yield replace(obj, box_rows=obj.box_rows // 2, boxes=obj.boxes * 2)
        if obj.mask:
            yield replace(obj, mask=obj.mask >> 1)
    if isinstance(obj, CpAsyncRing):
        yield replace(obj, stages=obj.stages + 1)
        yield replace(obj, prologue=obj.prologue + 1)
        yield replace(obj, wait_groups=obj.wait_groups + 1)


def _operand_variants(ops: MmaSyncOperands) -> Iterator[MmaSyncOperands]:
    """The shared-memory operand maps perturbed: each stage tile's swizzle and padding (store and read
    sides together), each ldmatrix lane map, the copies' vectors, the warp grid."""
    for side in ("a", "b"):
        tile, copy, read = getattr(ops, f"{side}_tile"), getattr(ops, f"{side}_copy"), getattr(ops, f"{side}_read")
        for other in (replace(tile, swizzle=0 if tile.swizzle else 128), replace(tile, row_elems=tile.row_elems + 8)):
            yield replace(ops, **{f"{side}_tile": other, f"{side}_copy": replace(copy, tile=other),
                                  f"{side}_read": replace(read, tile=other)})
        yield replace(ops, **{f"{side}_read": replace(read, row_lanes=read.row_lanes // 2, col_groups=2,
                                                      col_step=read.col_step + 1)})
        yield replace(ops, **{f"{side}_copy": replace(copy, vector=max(1, copy.vector // 2))})
    yield replace(ops, grid=replace(ops.grid, along_m=ops.grid.along_m + 1, warp_rows=ops.grid.warp_rows + 16,
                                    warp_cols=ops.grid.warp_cols + 8))


def _fma_operand_variants(ops: FmaOperands) -> Iterator[FmaOperands]:
    """The SIMT path's maps perturbed: each stage tile's padding and transpose (copies and reads
    together), the copies' walk and count, the thread grid and each thread's register tile, the block's
    threads, the k tile, the tiles' offsets."""
    for side in ("a", "b"):
        tile, copy = getattr(ops, f"{side}_tile"), getattr(ops, f"{side}_copy")
        for other in (replace(tile, row_elems=tile.row_elems + 1), replace(tile, k_rows=not tile.k_rows)):
            yield replace(ops, **{f"{side}_copy": replace(copy, tile=other), f"{side}_read": other})
        yield replace(ops, **{f"{side}_copy": replace(copy, inner=copy.outer, outer=copy.inner,
                                                       k_inner=not copy.k_inner)})
    g = ops.grid
    yield replace(ops, grid=replace(g, across=g.down, down=g.across))
    # each thread's register tile, the block's threads, the k tile, where the tiles start
    yield replace(ops, grid=replace(g, per_thread_m=g.per_thread_m + 1))
    yield replace(ops, grid=replace(g, per_thread_n=g.per_thread_n + 1))
    yield replace(ops, threads=ops.threads + 32)
    yield replace(ops, bk=ops.bk + 1)
    yield replace(ops, a_offset=ops.a_offset + 16, b_offset=ops.b_offset + 16)
    for side in ("a", "b"):
        copy = getattr(ops, f"{side}_copy")
        yield replace(ops, **{f"{side}_copy": replace(copy, outer=copy.outer + 1)})


def _wgmma_operand_variants(ops: WgmmaOperands) -> Iterator[WgmmaOperands]:
    """The wgmma path's maps perturbed: each tile's swizzle (copies and tensor maps), each descriptor's
    SBO and its LBO/SBO swapped, the copies' vectors, walk and count, the slabs' rows, the stage tiles'
    offsets and stride, the k tile's steps."""
    for side in ("a", "b"):
        tile, copy, desc = (getattr(ops, f"{side}_{x}") for x in ("tile", "copy", "desc"))
        yield replace(ops, **{f"{side}_copy": replace(copy, tile=replace(tile, swizzle=64))})
        yield replace(ops, **{f"{side}_desc": replace(desc, sbo=desc.sbo // 2)})
        yield replace(ops, **{f"{side}_desc": replace(desc, lbo=desc.sbo, sbo=desc.lbo)})
        yield replace(ops, **{f"{side}_copy": replace(copy, vector=max(1, copy.vector // 2))})
        # the copies' walk (k or the rows fastest) and count
        yield replace(ops, **{f"{side}_copy": replace(copy, k_inner=not copy.k_inner)})
        yield replace(ops, **{f"{side}_copy": replace(copy, outer=copy.outer + 1)})
    yield replace(ops, slabs=ops.slabs + 1)
    # the stage tiles' places in shared memory, the k tile's wgmma steps
    yield replace(ops, a_offset=ops.a_offset + 1024, b_offset=ops.b_offset + 1024)
    yield replace(ops, stage_stride=ops.stage_stride + 1024)
    yield replace(ops, bk=2 * ops.bk)
    yield replace(ops, base_align=ops.base_align // 2)


def _tma_store_variants(st: TmaStoreEpilogue) -> Iterator[TmaStoreEpilogue]:
    """The TMA-store epilogue perturbed: a box fewer, a column group fewer per box, a slab more, each
    buffer offset and stride moved, the boxes' swizzle, a buffer more in turn."""
    yield replace(st, boxes=st.boxes - 1)
    yield replace(st, groups=st.groups - 1)
    yield replace(st, slabs=st.slabs + 1)
    yield replace(st, base=st.base + 1024)
    yield replace(st, buffer_stride=0)
    yield replace(st, warpgroup_stride=st.warpgroup_stride + 1024)
    yield replace(st, box=replace(st.box, swizzle=64))
    yield replace(st, buffers=st.buffers + 1)


def _shortened(lw: ContractionLowering) -> ContractionLowering:
    class Shortened(type(lw)):  # type: ignore[misc]
        def k_range(self, split, s):
            begin, end = super().k_range(split, s)
            return begin, end - 1

    return Shortened(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def _with_override(lw: Any, method: str, planted: Callable[..., Any]) -> Any:
    """The lowering with one method's result planted wrong: `planted(the method as it was, *args)`."""
    base = getattr(type(lw), method)
    cls = type(f"Planted_{method}", (type(lw),),
               {method: lambda self, *args: planted(lambda *a: base(self, *a), *args)})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def _with_property(lw: Any, name: str, planted: Callable[[Any], Any]) -> Any:
    """The lowering with one property's value planted wrong: `planted(the value as it was)`."""
    base = getattr(type(lw), name)
    cls = type(f"Planted_{name}", (type(lw),), {name: property(lambda self: planted(base.fget(self)))})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def _more_register_chunks(lw: RowLowering) -> RowLowering:
    class More(type(lw)):  # type: ignore[misc]
        def register_chunks(self, sizes):
            n = super().register_chunks(sizes)
            return n + 1 if n else 0

    return More(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def _loops_shortened(lw: GeneralLowering) -> GeneralLowering:
    class Shortened(type(lw)):  # type: ignore[misc]
        def loop_end(self, axis, sizes):
            return super().loop_end(axis, sizes) - 1

    return Shortened(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def _code_lines(sources: list[str]) -> list[str]:
    return [ln for src in sources for ln in src.splitlines() if not _NOT_CODE.match(ln)]


def measure(lowered: LoweredPlan, emit: Callable[[LoweredPlan], list[str]], label: str) -> Measure:
    base = emit(lowered)
    lines = _code_lines(base)
    derived: set[int] = set()
    refused = 0
    for i, k in enumerate(lowered.kernels):
        for v in _variants(k):
            kernels = (*lowered.kernels[:i], v, *lowered.kernels[i + 1:])
            try:
                other = _code_lines(emit(replace(lowered, kernels=kernels)))
            except Exception:  # a perturbation the emitter refuses: it reads that field, but no line shows it
                refused += 1
                continue
            if len(other) != len(lines):
                derived.update(_moved(lines, other))
            else:
                derived.update(j for j, (a, b) in enumerate(zip(lines, other, strict=True)) if a != b)
    index = {j for j, ln in enumerate(lines) if _INDEX.search(ln)}
    return Measure(label, len(lines), len(derived), len(index), len(index & derived), refused)


def _moved(lines: list[str], other: list[str]) -> set[int]:
    """Lines of `lines` that are not in `other` at the same place (a diff's deletions)."""
    import difflib

    out: set[int] = set()
    for tag, i1, i2, _j1, _j2 in difflib.SequenceMatcher(a=lines, b=other, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            out.update(range(i1, i2))
    return out


def run() -> list[Measure]:
    from habu.paths.emit import emit_lowered
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    out = []
    for label, example, model_name, shape, pins, target_name in CASES:
        target = TARGETS[target_name]
        model = load_program(EXAMPLES / example).models[model_name]
        model = model.with_sizes(shape) if shape else model
        plan = default_plan(model, target, shape or None, pins)
        lowered = lower_whole(model, plan)

        def emit(lw: LoweredPlan, plan=plan, target=target) -> list[str]:
            return [k.source for k in emit_lowered(lw, plan, target).kernels]

        out.append(measure(lowered, emit, label))
    return out


def main() -> None:
    rows = run()
    print("| path | code lines | from the lowering | index-arithmetic lines | from the lowering |")
    print("|---|---|---|---|---|")
    for m in rows:
        print(f"| {m.label} | {m.lines} | {m.derived} ({100 * m.share:.0f}%) | {m.index_lines} | "
              f"{m.index_derived} ({100 * m.index_share:.0f}%) |")
    t, d = sum(m.lines for m in rows), sum(m.derived for m in rows)
    ti, di = sum(m.index_lines for m in rows), sum(m.index_derived for m in rows)
    print(f"| all | {t} | {d} ({100 * d / t:.0f}%) | {ti} | {di} ({100 * di / ti:.0f}%) |")


if __name__ == "__main__":
    main()
