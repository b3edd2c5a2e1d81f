"""Executing the grouped mma.sync loop's shared-memory maps (habu/lower/grouped_mma.py) on element identities,
as `habu.prove.smem_route` does for the contraction paths: every thread's copies write each chunk's
identities where the copy map puts them (`StageCopy.along`, the tile's `storage`), each warp's lanes read
their operand registers back word by word (`GroupedMmaLoop.a_row` / `w_row` / `k_col`, `WordRead.word`),
and the PTX ISA's m16n8k16 operand layout (`habu.prove.fragments.mma_operand_position`, the trusted table)
says which operand position each register half is. The result is a `Route`; the epilogue's accumulator map
is compared with the instruction's by `fragment_mismatch`. A copy or read outside its tile, an element
written twice or read where nothing was written is a fault."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from habu.lower.grouped_mma import MMA_M, MMA_N, GroupedMmaLoop, WordRead
from habu.lower.grouped_wgmma import WgmmaMainLoop
from habu.lower.layouts import SmemTile, StageCopy
from habu.lower.quad_vectors import QuadVectors
from habu.lower.registers import WARPGROUP
from habu.prove.fragments import fragment_mismatch, instruction_element, mma_operand_position
from habu.prove.smem_route import Route, WarpRoute, _is_identity, wgmma_route


def _fill(side: str, loop: GroupedMmaLoop, tile: SmemTile, copy: StageCopy, faults: list[str]) -> np.ndarray:
    """The stage tile after every thread's copies (chunk `loop.chunk(tid, q)` of each): each element's
    identity mn·bk + k, -1 where nothing was written."""
    bk = loop.bk
    smem = np.full(tile.rows * tile.row_elems, -1, dtype=np.int64)
    tid = np.arange(loop.threads, dtype=np.int64)[:, None]
    q = np.arange(loop.copies(copy), dtype=np.int64)[None, :]
    e = np.asarray(loop.chunk(tid, q), dtype=np.int64).ravel()
    mn, k = copy.element(*copy.along(e))
    mn, k = np.asarray(mn, dtype=np.int64), np.asarray(k, dtype=np.int64)
    row, col = tile.storage(mn, k)
    row, col = np.asarray(row, dtype=np.int64), np.asarray(col, dtype=np.int64)
    bad = (row < 0) | (row >= tile.rows) | (col < 0) | (col + copy.vector > tile.row_elems) | (col % copy.vector != 0)
    if bad.any():
        i = int(np.nonzero(bad)[0][0])
        faults.append(f"the copy of {side}'s element ({int(mn[i])}, {int(k[i])}) writes {copy.vector} elements at "
                      f"[{int(row[i])}][{int(col[i])}] of its {tile.rows} × {tile.row_elems} stage tile (outside a "
                      "row, or not a whole chunk)")
    v = np.arange(copy.vector, dtype=np.int64)[None, :]
    ids = (mn[:, None] * bk + k[:, None] + v) if copy.k_inner else ((mn[:, None] + v) * bk + k[:, None])
    slots = tile.index(row, col)[:, None] + v
    keep = np.broadcast_to(~bad[:, None], slots.shape)
    slots, ids = slots[keep], ids[keep]
    counts = np.bincount(slots, minlength=len(smem))
    if (counts > 1).any():
        s = int(np.nonzero(counts > 1)[0][0])
        faults.append(f"two copies write element {s} of {side}'s stage tile")
    smem[slots] = ids
    return smem


def _words(side: str, smem: np.ndarray, tile: SmemTile, read: WordRead, first_mn: np.ndarray, first_k: np.ndarray,
           faults: list[str]) -> np.ndarray:
    """The identities each (lane, register, half) receives: register j's word at the lane's first (mn, k)
    plus `read.word(j)`, its two bf16 halves."""
    out = np.full((32, read.registers, 2), -1, dtype=np.int64)
    for j in range(read.registers):
        d_mn, d_k = read.word(j)
        row, col = tile.storage(first_mn + d_mn, first_k + d_k)
        row, col = np.asarray(row, dtype=np.int64), np.asarray(col, dtype=np.int64)
        bad = (row < 0) | (row >= tile.rows) | (col < 0) | (col + read.pair > tile.row_elems) | (col % read.pair != 0)
        if bad.any():
            lane = int(np.nonzero(bad)[0][0])
            faults.append(f"lane {lane} reads register {j} of {side} at [{int(row[lane])}][{int(col[lane])}] of its "
                          f"{tile.rows} × {tile.row_elems} stage tile (outside a row, or not a whole word)")
        at = np.where(bad, 0, tile.index(row, col))
        for h in range(read.pair):
            out[:, j, h] = smem[at + h]
    if (out < 0).any():
        faults.append(f"a warp reads {side}'s stage tile where no copy wrote")
    return out


@lru_cache(maxsize=256)
def grouped_mma_route(loop: GroupedMmaLoop) -> Route:
    faults: list[str] = []
    bk, g = loop.bk, loop.grid
    a_smem = _fill("A", loop, loop.a_tile, loop.a_copy, faults)
    w_smem = _fill("W", loop, loop.w_tile, loop.w_copy, faults)
    lane = np.arange(32, dtype=np.int64)
    a_row, a_col = mma_operand_position("A")
    b_k, b_n = mma_operand_position("B")
    mi_count, ni_count = loop.mma_tiles
    warps = []
    for w in range(loop.threads // loop.warp_size):
        x = w * loop.warp_size + lane  # the warp's threads, decoded as the kernel does
        wl, ww = np.asarray(loop.lane(x)), np.asarray(loop.warp(x))
        if not (np.array_equal(wl, lane) and (ww == w).all()):
            faults.append(f"threads {w * loop.warp_size}..{w * loop.warp_size + 31} decode as lanes {int(wl[0])}.. of "
                          f"warp {int(ww[0])}, not lanes 0..31 of warp {w}")
        wm, wn = g.warp_m(w), g.warp_n(w)
        a_id = np.full((g.warp_rows, bk), -1, dtype=np.int64)
        b_id = np.full((g.warp_cols, bk), -1, dtype=np.int64)
        for ks in range(0, bk, loop.mma_k):
            k0 = np.asarray(loop.k_col(ks, lane), dtype=np.int64)
            for mi in range(mi_count):
                got = _words("A", a_smem, loop.a_tile, loop.a_read, np.asarray(loop.a_row(wm, mi, lane)), k0, faults)
                a_id[mi * MMA_M + a_row, ks + a_col] = got
            for ni in range(ni_count):
                got = _words("W", w_smem, loop.w_tile, loop.w_read, np.asarray(loop.w_row(wn, ni, lane)), k0, faults)
                b_id[ni * MMA_N + b_n, ks + b_k] = got
        a_id, b_id = np.maximum(a_id, 0), np.maximum(b_id, 0)
        rows = g.row_origin(wm) + np.arange(g.warp_rows)
        cols = g.col_origin(wn) + np.arange(g.warp_cols)
        warps.append(WarpRoute(rows, cols, a_id // bk, a_id % bk, b_id // bk, b_id % bk))
    moved = fragment_mismatch("mma.sync", loop.fragment, 1)
    if moved is not None:
        faults.append(moved)
    bm, bn = loop.a_copy.outer, loop.w_copy.outer
    return Route(tuple(warps), tuple(dict.fromkeys(faults))[:4], not faults and _is_identity(warps, bm, bn, bk))


@lru_cache(maxsize=256)
def epilogue_moves(loop: GroupedMmaLoop) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The epilogue's stores against the instruction: register q of accumulator (i, j) of each lane of each
    warp holds the tile element the PTX ISA's table gives (held rows, columns) and is stored at the one the
    lowering's `accumulator` gives (stored rows, columns); None where they agree everywhere."""
    g, lane = loop.grid, np.arange(32)
    mi, ni = loop.mma_tiles
    w, i, j, ln, q = np.meshgrid(np.arange(loop.threads // loop.warp_size), np.arange(mi), np.arange(ni), lane,
                                 np.arange(loop.fragment.registers(1)), indexing="ij")
    er, ec = loop.accumulator(g.warp_m(w), g.warp_n(w), i, j, ln, q)
    er, ec = np.broadcast_to(er, w.shape), np.broadcast_to(ec, w.shape)
    hr, hc = instruction_element("mma.sync", np.zeros_like(ln), ln, q % 4)
    hr = g.row_origin(g.warp_m(w)) + MMA_M * i + hr
    hc = g.col_origin(g.warp_n(w)) + MMA_N * j + hc
    if np.array_equal(er, hr) and np.array_equal(ec, hc):
        return None
    return hr.ravel(), hc.ravel(), np.asarray(er).ravel(), np.asarray(ec).ravel()


def wgmma_loop_route(loop: WgmmaMainLoop) -> Route:
    """The contraction path's wgmma route (`habu.prove.smem_route.wgmma_route`: the stage tiles, TMA's and the
    copies' swizzle, the descriptors) as the grouped loop's consumer warpgroups take its slabs: warpgroup wg
    multiplies and stores the slabs of consumer `loop.consumer(wg)`; a decode outside 0..C−1 multiplies rows
    past the tile (dropped: another block's output), a consumer no warpgroup decodes to is never computed."""
    base = wgmma_route(loop.operands)
    slabs = loop.operands.slabs
    decoded = [int(loop.consumer(int(loop.warpgroup(wg * loop.warpgroup_size)))) for wg in range(1, loop.consumers + 1)]
    if decoded == list(range(loop.consumers)):
        return base
    warps = tuple(base.warps[cw * slabs + s] for cw in decoded if 0 <= cw < loop.consumers for s in range(slabs))
    return Route(warps, base.faults, False)


@lru_cache(maxsize=256)
def producer_uncopied(loop: WgmmaMainLoop) -> np.ndarray | None:
    """The elements (row, k) of A's k tile no producer thread copies (`a_copy_row`, `a_copy_k` over its 128
    threads and its copies): stale shared memory where the consumers read them; None where every one is."""
    copy = loop.operands.a_copy
    bm = copy.outer if copy.k_inner else copy.inner
    ptid = np.asarray(loop.producer_thread(np.arange(loop.warpgroup_size, dtype=np.int64)))[:, None]
    j = np.arange(loop.producer_copies(), dtype=np.int64)[None, :]
    rows = np.broadcast_to(np.asarray(loop.a_copy_row(ptid, j)), (ptid.shape[0], j.shape[1])).ravel()
    ks = np.broadcast_to(np.asarray(loop.a_copy_k(ptid)), (ptid.shape[0], j.shape[1])).ravel()
    copied = np.zeros((bm, loop.operands.bk), dtype=bool)
    for v in range(copy.vector):
        ok = (rows >= 0) & (rows < bm) & (ks + v >= 0) & (ks + v < loop.operands.bk)
        copied[rows[ok], ks[ok] + v] = True
    return None if copied.all() else ~copied


def _quad_moves(loop: WgmmaMainLoop, groups: int) -> tuple[np.ndarray, ...]:
    """The 4-wide epilogue's stores: each thread's four columns of its kept row half (`quad_column` + slot i)
    hold the register `quad_source` names (its own or its partner's through the shuffle; a slot with none
    is not stored), at the element wgmma put that register."""
    f = loop.fragment
    x, j, i = np.meshgrid(np.arange(WARPGROUP), np.arange(groups), np.arange(2 * f.pair), indexing="ij")
    warp, lane = f.thread_warp(x), f.thread_lane(x)
    sources = [loop.quad_source(lane, slot) for slot in range(2 * f.pair)]
    pick = lambda n: np.choose(i, [np.broadcast_to(np.asarray(s[n]), x.shape) for s in sources])  # noqa: E731
    src, half, q, present = (pick(n) for n in range(4))
    hr, hc = instruction_element("wgmma", warp, src, f.register_index(j, half, q))
    sr = warp * f.warp_rows + lane // f.lanes_per_row + f.row_step * np.asarray(loop.quad_kept_half(lane))
    sc = np.asarray(loop.quad_column(lane, j)) + i
    keep = present.astype(bool)
    return hr[keep], hc[keep], sr[keep], sc[keep]


@lru_cache(maxsize=256)
def vector_moves(loop: WgmmaMainLoop, qv: QuadVectors) -> tuple[tuple[np.ndarray, ...], tuple[str, ...]]:
    """The 16-byte epilogue's trade (habu/lower/quad_vectors.py) over every slab of every consumer: in round r
    of set u, lane l receives lane l ^ `offset(r)`'s pair of group `sent_group(u, l ^ offset(r), r)` (shfl.bfly:
    each lane sends what its own place selects) into slot `slot(l, r)` of its vector, stored at `element`. Returns
    (held rows, held columns, stored rows, stored columns) in the tile, held as the fragment places the sender's
    register (`fragment.element`: checked against the instruction apart), and the faults: a tile element stored
    twice or never."""
    f = loop.fragment
    x, u, h, q = np.meshgrid(np.arange(WARPGROUP), np.arange(qv.sets), np.arange(f.halves), np.arange(f.pair),
                             indexing="ij")
    warp, lane = f.thread_warp(x), f.thread_lane(x)
    moved = []
    for r in qv.rounds:  # the rounds are unrolled in the kernel: each its own offset, group and slot
        src = (lane ^ qv.offset(r)) % 32
        held = f.element(warp, src, qv.sent_group(u, src, r), h, q)
        stored = qv.element(warp, lane, u, h, qv.slot(lane, r), q)
        moved.append([np.broadcast_to(np.asarray(v), x.shape) for v in (*held, *stored)])
    hr, hc, sr, sc = (np.stack([m[i] for m in moved]) for i in range(4))
    faults = []
    cells = np.asarray(sr) * loop.bn + np.asarray(sc)
    counts = np.bincount(np.clip(cells.ravel(), 0, None), minlength=f.warp_rows * f.group_warps * loop.bn)
    if (sr < 0).any() or (sc < 0).any() or (sc >= loop.bn).any() or (counts != 1).any():
        faults.append(f"the {qv.elements}-element vectors' trade stores a slab's elements {int(counts.min())}.."
                      f"{int(counts.max())} times (each once)")
    rows = f.warp_rows * f.group_warps
    if (hr < 0).any() or (hr >= rows).any() or (hc < 0).any() or (hc >= loop.bn).any():
        faults.append(f"the {qv.elements}-element vectors' trade sends a register past the accumulator's "
                      f"{rows} × {loop.bn} slab (a column group or lane that does not exist)")
    ops = loop.operands
    origins = [int(ops.slab_row(cw, s)) for cw in range(ops.consumers) for s in range(ops.slabs)]
    cat = lambda v, o: np.concatenate([np.asarray(v).ravel() + d for d in o])  # noqa: E731
    zero = [0] * len(origins)
    return (cat(hr, origins), cat(hc, zero), cat(sr, origins), cat(sc, zero)), tuple(faults)


@lru_cache(maxsize=256)
def wgmma_epilogue_moves(loop: WgmmaMainLoop) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """The consumers' stores against wgmma's accumulator layout (PTX ISA): register (j, h, q) of thread x of a
    warpgroup holds the slab element `instruction_element` gives and is stored at `fragment.element` of the
    thread's decoded warp and lane (the 4-wide epilogue: `_quad_moves`, through the lanes' trade); over
    every slab of every consumer. None where they agree."""
    f = loop.fragment
    groups = loop.accumulator_groups()
    x, j, h, q = np.meshgrid(np.arange(WARPGROUP), np.arange(groups), np.arange(f.halves), np.arange(f.pair),
                             indexing="ij")
    reg = f.register_index(j, h, q)
    hr, hc = instruction_element("wgmma", x // 32, x % 32, reg)
    sr, sc = f.element(f.thread_warp(x), f.thread_lane(x), j, h, q)
    whole = True
    if loop.store_vector == 4:  # every element of the slab stored once, from its own register
        hr, hc, sr, sc = _quad_moves(loop, groups)
        cells = np.unique(np.asarray(sr) * loop.mma_columns + np.asarray(sc))
        whole = len(sr) == len(cells) == x.size
    if whole and np.array_equal(hr, sr) and np.array_equal(hc, sc):
        return None
    ops = loop.operands
    origins = [int(ops.slab_row(cw, s)) for cw in range(ops.consumers) for s in range(ops.slabs)]
    cat = lambda v, o: np.concatenate([np.asarray(v).ravel() + d for d in o])  # noqa: E731
    zero = [0] * len(origins)
    return cat(hr, origins), cat(hc, zero), cat(sr, origins), cat(sc, zero)


__all__ = ["epilogue_moves", "grouped_mma_route", "producer_uncopied", "vector_moves", "wgmma_epilogue_moves",
           "wgmma_loop_route"]
