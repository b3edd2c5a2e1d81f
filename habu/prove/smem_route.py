"""Executing the shared-memory operand maps of a contraction (`habu.lower.layouts`): which element of the
staged k tile reaches each operand position of each warp's mma (or, on the SIMT path, each thread's
FMAs: a "warp" of the route is then one thread).

The maps do not depend on the data or on the tile's position, so they are run once per lowering on
element *identities*: shared memory is an array indexed by the layout's offsets; the store map writes
each k-tile element's identity where its copy puts it, the read map gives each lane's ldmatrix row
address, the PTX ISA's ldmatrix and mma.m16n8k16 operand layouts (`habu.prove.fragments`, the trusted
tables) say which address lands in which register and which operand position that register is. The
result, a `Route`, tells the interpreter which (row, k) of the tile each warp multiplies at each
(output row or column, instruction k): it loads those elements and feeds them to the product, so a
wrong swizzle, row stride, lane map or warp origin changes the finite-field result. Faults: a copy or
ldmatrix row outside its buffer or not aligned to its size (16 bytes at most), an element written
twice, a read of shared memory no copy wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from habu.lower.layouts import FmaOperands, MmaSyncOperands, SmemTile, StageCopy, WgmmaOperands
from habu.prove.fragments import (
    ldmatrix_elements,
    mma_operand_position,
    wgmma_kmajor_addresses,
    wgmma_mnmajor_addresses,
)


@dataclass(frozen=True)
class WarpRoute:
    """What one warp multiplies: output tile rows `rows` and columns `cols`; at (rows[i], instruction k
    j) A's operand is the k tile's element (a_mn[i, j], a_k[i, j]), likewise B's at (cols[i], j)."""

    rows: np.ndarray
    cols: np.ndarray
    a_mn: np.ndarray
    a_k: np.ndarray
    b_mn: np.ndarray
    b_k: np.ndarray


@dataclass(frozen=True)
class Route:
    warps: tuple[WarpRoute, ...]
    faults: tuple[str, ...]
    identity: bool  # every warp multiplies the elements a plain tile product would, each output once


def plain_route(bm: int, bn: int, bk: int) -> Route:
    """One 'warp' that multiplies the k tile as loaded (paths whose operand maps the lowering does not
    hold yet)."""
    k = np.arange(bk)[None, :]
    rows, cols = np.arange(bm), np.arange(bn)
    warp = WarpRoute(rows, cols, np.broadcast_to(rows[:, None], (bm, bk)), np.broadcast_to(k, (bm, bk)),
                     np.broadcast_to(cols[:, None], (bn, bk)), np.broadcast_to(k, (bn, bk)))
    return Route((warp,), (), True)


def _fill(side: str, tile: SmemTile, copy: StageCopy, bk: int, faults: list[str]) -> np.ndarray:
    """Shared memory of one stage tile after every copy: each element's identity mn·bk + k, -1 where
    nothing was written."""
    eb = tile.elem_bytes
    smem = np.full(tile.bytes // eb, -1, dtype=np.int64)
    e = np.arange(copy.count, dtype=np.int64)
    mn, k = copy.element(*copy.along(e))
    start = np.asarray(copy.byte_offset(mn, k), dtype=np.int64)
    width = copy.vector * eb
    align = min(width, 16)
    bad = (start % align != 0) | (start < 0) | (start + width > tile.bytes)
    if bad.any():
        i = int(np.nonzero(bad)[0][0])
        faults.append(f"the copy of {side}'s element ({int(mn[i])}, {int(k[i])}) writes {width} bytes at byte "
                      f"{int(start[i])} of its {tile.bytes}-byte stage tile (outside it, or not {align}-byte aligned)")
    v = np.arange(copy.vector, dtype=np.int64)[None, :]
    ids = (mn[:, None] * bk + k[:, None] + v) if copy.k_inner else ((mn[:, None] + v) * bk + k[:, None])
    slots = start[:, None] // eb + v
    keep = np.broadcast_to(~bad[:, None], slots.shape)  # a copy outside the tile lands elsewhere
    slots, ids = slots[keep], ids[keep]
    counts = np.bincount(slots, minlength=len(smem))
    if (counts > 1).any():
        s = int(np.nonzero(counts > 1)[0][0])
        faults.append(f"two copies write byte {s * eb} of {side}'s stage tile")
    smem[slots] = ids
    return smem


def _read(side: str, smem: np.ndarray, tile: SmemTile, addresses: np.ndarray, matrices: int, trans: bool,
          faults: list[str]) -> np.ndarray:
    """The identities each (lane, register, half) receives from one ldmatrix."""
    used = np.asarray(addresses, dtype=np.int64)[: 8 * matrices]
    bad = (used % 16 != 0) | (used < 0) | (used + 16 > tile.bytes)
    if bad.any():
        i = int(np.nonzero(bad)[0][0])
        faults.append(f"ldmatrix lane {i} reads {side}'s stage tile at byte {int(used[i])} (outside its "
                      f"{tile.bytes} bytes, or not 16-byte aligned)")
    rows = np.zeros(32, dtype=np.int64)
    rows[: 8 * matrices] = np.where(bad, 0, used) // tile.elem_bytes
    got = smem[ldmatrix_elements(rows, matrices, trans)]
    if (got < 0).any():
        faults.append(f"ldmatrix reads {side}'s stage tile where no copy wrote")
    return got


@lru_cache(maxsize=512)
def mma_sync_route(ops: MmaSyncOperands) -> Route:
    faults: list[str] = []
    bk = ops.bk
    a_smem = _fill("A", ops.a_tile, ops.a_copy, bk, faults)
    b_smem = _fill("B", ops.b_tile, ops.b_copy, bk, faults)
    lane = np.arange(32, dtype=np.int64)
    a_row, a_col = mma_operand_position("A")
    b_k, b_n = mma_operand_position("B")
    g = ops.grid
    mi_count, ni_count = g.warp_rows // 16, g.warp_cols // 8
    warps = []
    for w in range(ops.warps):
        wm, wn = g.warp_m(w), g.warp_n(w)
        a_id = np.full((g.warp_rows, bk), -1, dtype=np.int64)
        b_id = np.full((g.warp_cols, bk), -1, dtype=np.int64)
        for ks in range(bk // 16):
            for mi in range(mi_count):
                got = _read("A", a_smem, ops.a_tile, ops.a_fragment(wm, mi, ks, lane), ops.a_read.matrices,
                            ops.a_read.trans, faults)
                a_id[mi * 16 + a_row, ks * 16 + a_col] = got
            for ni in range(ni_count):
                got = _read("B", b_smem, ops.b_tile, ops.b_fragment(wn, ni, ks, lane), ops.b_read.matrices,
                            ops.b_read.trans, faults)
                b_id[ni * 8 + b_n, ks * 16 + b_k] = got
        a_id, b_id = np.maximum(a_id, 0), np.maximum(b_id, 0)
        rows = g.row_origin(wm) + np.arange(g.warp_rows)
        cols = g.col_origin(wn) + np.arange(g.warp_cols)
        warps.append(WarpRoute(rows, cols, a_id // bk, a_id % bk, b_id // bk, b_id % bk))
    bm = ops.a_copy.outer if ops.a_copy.k_inner else ops.a_copy.inner  # (an A stored [k m] is copied along m)
    bn = ops.b_copy.outer if ops.b_copy.k_inner else ops.b_copy.inner
    return Route(tuple(warps), tuple(dict.fromkeys(faults))[:4], not faults and _is_identity(warps, bm, bn, bk))


@lru_cache(maxsize=512)
def fma_route(ops: FmaOperands) -> Route:
    """The SIMT path: thread (tx, ty) reads A's stage tile at `a_index(k, ty, i)` for its i-th row and
    B's at `b_index(k, tx, j)` for its j-th column, one f32 element each (the copies convert)."""
    faults: list[str] = []
    bk, g = ops.bk, ops.grid
    a_smem = _fill("A", ops.a_tile, ops.a_copy, bk, faults)
    b_smem = _fill("B", ops.b_tile, ops.b_copy, bk, faults)
    k = np.arange(bk, dtype=np.int64)[None, :]

    def fetch(side: str, smem: np.ndarray, index: np.ndarray) -> np.ndarray:
        bad = (index < 0) | (index >= len(smem))
        if bad.any():
            faults.append(f"a thread reads {side}'s stage tile at element {int(index[bad].flat[0])}, outside its "
                          f"{len(smem)} elements")
        got = smem[np.where(bad, 0, index)]
        if (got < 0).any():
            faults.append(f"a thread reads {side}'s stage tile where no copy wrote")
        return np.maximum(got, 0)

    bm = ops.a_copy.outer if ops.a_copy.k_inner else ops.a_copy.inner
    bn = ops.b_copy.outer if ops.b_copy.k_inner else ops.b_copy.inner
    _tiles_apart(ops, faults)
    warps = []
    i = np.arange(g.per_thread_m, dtype=np.int64)[:, None]
    j = np.arange(g.per_thread_n, dtype=np.int64)[:, None]
    for t in range(ops.threads):
        tx, ty = g.tx(t), g.ty(t)
        a_id = fetch("A", a_smem, np.asarray(ops.a_index(k, ty, i), dtype=np.int64))
        b_id = fetch("B", b_smem, np.asarray(ops.b_index(k, tx, j), dtype=np.int64))
        rows = sum(g.row_terms(ty, i[:, 0]))
        cols = sum(g.col_terms(tx, j[:, 0]))
        # the epilogue stores each register at m0 + row, n0 + col: a row or column past the tile is
        # another block's output (a race between blocks, or a double add under split-K)
        for what, got, size in (("row", rows, bm), ("column", cols, bn)):
            out = (got < 0) | (got >= size)
            if out.any():
                faults.append(f"thread {t} computes {what} {int(got[out][0])} of its block's {size}-{what} "
                              "output tile, which is outside it (another block's output)")
        warps.append(WarpRoute(rows, cols, a_id // bk, a_id % bk, b_id // bk, b_id % bk))
    return Route(tuple(warps), tuple(dict.fromkeys(faults))[:4], not faults and _is_identity(warps, bm, bn, bk))


def _tiles_apart(ops: FmaOperands, faults: list[str]) -> None:
    """The SIMT path's two stage tiles lie apart in shared memory, each 4-byte aligned (the kernel
    points sA and sB at `a_offset` and `b_offset`)."""
    spans = (("A", ops.a_offset, ops.a_tile.bytes), ("B", ops.b_offset, ops.b_tile.bytes))
    for side, start, _size in spans:
        if start < 0 or start % 4:
            faults.append(f"{side}'s stage tile starts at byte {start} of shared memory (negative or not 4-byte "
                          "aligned)")
    (_, a0, a_size), (_, b0, b_size) = spans
    if a0 < b0 + b_size and b0 < a0 + a_size:
        # the first element of the earlier tile that the later tile's copies overwrite
        (low, low0, low_tile), high0 = (("A", a0, ops.a_tile), b0) if a0 <= b0 else (("B", b0, ops.b_tile), a0)
        row, col = divmod((high0 - low0) // 4, low_tile.row_elems)
        faults.append(f"A's stage tile (bytes {a0}..{a0 + a_size - 1}) and B's (bytes {b0}..{b0 + b_size - 1}) "
                      f"overlap in shared memory: the copies of the other operand overwrite s{low}[{row}][{col}]")


@lru_cache(maxsize=512)
def wgmma_route(ops: WgmmaOperands) -> Route:
    """The wgmma path: slab s of consumer warpgroup cw multiplies, at k step kk, the 64 x 16 A operand
    its descriptor (start `a_start(cw, s, kk)`, SBO, swizzle) addresses and the BN x 16 B operand at
    `b_start(kk)`, as the PTX ISA's K-major layout places them (`wgmma_kmajor_addresses`), or its
    MN-major one for an operand read with the transpose bit (`wgmma_mnmajor_addresses`)."""
    faults: list[str] = []
    bk = ops.bk
    _stages_apart(ops, faults)
    a_smem = _fill("A", ops.a_tile, ops.a_copy, bk, faults)
    b_smem = _fill("B", ops.b_tile, ops.b_copy, bk, faults)
    bn = ops.bn

    def b_addresses(kk: int) -> np.ndarray:
        d, start = ops.b_desc, int(sum(ops.b_start(kk)))
        if d.mn_major:
            return wgmma_mnmajor_addresses(start, bn, 16, d.lbo, d.sbo, d.swizzle, ops.b_tile.elem_bytes)
        return wgmma_kmajor_addresses(start, bn, 16, d.sbo, d.swizzle, ops.b_tile.elem_bytes)

    def fetch(side: str, smem: np.ndarray, tile: SmemTile, addr: np.ndarray, desc) -> np.ndarray:
        if desc.sbo % 16 or desc.lbo % 16:
            faults.append(f"{side}'s descriptor offsets are not multiples of 16 bytes")
        bad = (addr < 0) | (addr + tile.elem_bytes > tile.bytes) | (addr % tile.elem_bytes != 0)
        if bad.any():
            faults.append(f"wgmma reads {side}'s stage tile at byte {int(addr[bad].flat[0])}, outside its "
                          f"{tile.bytes} bytes")
        got = smem[np.where(bad, 0, addr) // tile.elem_bytes]
        if (got < 0).any():
            faults.append(f"wgmma reads {side}'s stage tile where no copy wrote")
        return np.maximum(got, 0)

    b_id = np.concatenate([fetch("B", b_smem, ops.b_tile, b_addresses(kk), ops.b_desc)
                           for kk in range(ops.k_steps)], axis=1)
    warps = []
    bm = ops.bm

    def a_addresses(cw: int, s: int, kk: int) -> np.ndarray:
        d, start = ops.a_desc, int(sum(ops.a_start(cw, s, kk)))
        if d.mn_major:
            return wgmma_mnmajor_addresses(start, 64, 16, d.lbo, d.sbo, d.swizzle, ops.a_tile.elem_bytes)
        return wgmma_kmajor_addresses(start, 64, 16, d.sbo, d.swizzle, ops.a_tile.elem_bytes)

    for cw in range(ops.consumers):
        for s in range(ops.slabs):
            a_id = np.concatenate([fetch("A", a_smem, ops.a_tile, a_addresses(cw, s, kk), ops.a_desc)
                                   for kk in range(ops.k_steps)], axis=1)
            rows = ops.slab_row(cw, s) + np.arange(64)
            if rows.min() < 0 or rows.max() >= bm:  # the epilogue stores the slab's rows at m0 + row
                faults.append(f"consumer {cw}'s slab {s} multiplies rows {int(rows.min())}..{int(rows.max())} of a "
                              f"{bm}-row tile (past it: another block's output)")
            warps.append(WarpRoute(rows, np.arange(bn), a_id // bk, a_id % bk, b_id // bk, b_id % bk))
    return Route(tuple(warps), tuple(dict.fromkeys(faults))[:4], not faults and _is_identity(warps, bm, bn, bk))


def _stages_apart(ops: WgmmaOperands, faults: list[str]) -> None:
    """The wgmma path's stage tiles (A and B of every stage) lie apart in shared memory, each aligned to
    its swizzle's period (8 rows of the span: the pattern TMA writes and wgmma reads starts there)."""
    tiles = [(f"{side}{s}", int(ops.stage_tile(side, s)), tile)
             for s in range(ops.stages) for side, tile in (("A", ops.a_tile), ("B", ops.b_tile))]
    for name, start, tile in tiles:
        period = 8 * tile.swizzle if tile.swizzle else 16
        if ops.base_align % period:
            faults.append(f"the shared-memory base is rounded to {ops.base_align} bytes; stage tile {name}'s swizzle "
                          f"repeats every {period} bytes from an address aligned to them ({name}[0, 0] is "
                          "swizzled as another row)")
        if start < 0 or start % period:
            faults.append(f"stage tile {name} starts at byte {start} of shared memory (negative or not "
                          f"{period}-byte aligned)")
    for i, (name, start, tile) in enumerate(tiles):
        for other, start2, tile2 in tiles[i + 1:]:
            if start < start2 + tile2.bytes and start2 < start + tile.bytes:
                # the first element of the earlier tile that the later one's copies overwrite
                (low, low0, low_tile), high0 = ((name, start, tile), start2) if start <= start2 else \
                    ((other, start2, tile2), start)
                row, col = divmod((high0 - low0) // low_tile.elem_bytes, low_tile.row_elems)
                faults.append(f"stage tiles {name} (bytes {start}..{start + tile.bytes - 1}) and {other} (bytes "
                              f"{start2}..{start2 + tile2.bytes - 1}) overlap: {low}[{row}, {col}] is overwritten")


def _is_identity(warps: list[WarpRoute], bm: int, bn: int, bk: int) -> bool:
    k = np.arange(bk)[None, :]
    for w in warps:
        if not (np.array_equal(w.a_mn, np.broadcast_to(w.rows[:, None], w.a_mn.shape))
                and np.array_equal(w.b_mn, np.broadcast_to(w.cols[:, None], w.b_mn.shape))
                and np.array_equal(w.a_k, np.broadcast_to(k, w.a_k.shape))
                and np.array_equal(w.b_k, np.broadcast_to(k, w.b_k.shape))):
            return False
    covered = np.zeros((bm, bn), dtype=np.int64)
    for w in warps:
        if w.rows.min() < 0 or w.rows.max() >= bm or w.cols.min() < 0 or w.cols.max() >= bn:
            return False
        covered[np.ix_(w.rows, w.cols)] += 1
    return bool((covered == 1).all())


def route_of(lw) -> Route:
    """The operand route of a contraction lowering (`ContractionLowering.operands`, or the plain one)."""
    if lw.operands is None:
        return plain_route(lw.bm, lw.bn, lw.bk)
    if isinstance(lw.operands, FmaOperands):
        return fma_route(lw.operands)
    if isinstance(lw.operands, WgmmaOperands):
        return wgmma_route(lw.operands)
    return mma_sync_route(lw.operands)


def route_key(lw) -> str:
    """What the finite-field check's result depends on through the operand maps: nothing when the route
    is the plain tile product (so plans differing only in emission still share one check), else the
    maps themselves."""
    if lw.operands is None or route_of(lw).identity:
        return "plain"
    return repr(lw.operands)


def warp_parts(route: Route, bm: int, bn: int, lrows: tuple[int, ...], lcols: tuple[int, ...]):
    """Per warp of the route, the computed rows and columns it owns: (their places in the block's
    accumulator, the k-tile elements its A and B operands take at each instruction k)."""
    pos_r = np.full(bm, -1, dtype=np.int64)
    pos_r[list(lrows)] = np.arange(len(lrows))
    pos_c = np.full(bn, -1, dtype=np.int64)
    pos_c[list(lcols)] = np.arange(len(lcols))
    groups: dict[tuple, list] = {}  # warps that multiply the same A rows: one product over all their columns
    for w in route.warps:
        ri = np.nonzero((w.rows >= 0) & (w.rows < bm))[0]
        ri = ri[pos_r[w.rows[ri]] >= 0]
        ci = np.nonzero((w.cols >= 0) & (w.cols < bn))[0]
        ci = ci[pos_c[w.cols[ci]] >= 0]
        if len(ri) and len(ci):
            key = (w.rows[ri].tobytes(), w.a_mn[ri].tobytes(), w.a_k[ri].tobytes())
            groups.setdefault(key, []).append((ri, ci, w))
    parts = []
    for members in groups.values():
        cols = np.concatenate([w.cols[ci] for _, ci, w in members])
        split = members if len(np.unique(cols)) < len(cols) else [members]  # overlapping columns: one by one
        for part in split:
            part = part if isinstance(part, list) else [part]
            ri, _, w0 = part[0]
            parts.append((pos_r[w0.rows[ri]], np.concatenate([pos_c[w.cols[ci]] for _, ci, w in part]),
                          w0.a_mn[ri], w0.a_k[ri], np.concatenate([w.b_mn[ci] for _, ci, w in part]),
                          np.concatenate([w.b_k[ci] for _, ci, w in part])))
    # then parts that multiply the same B columns: one product over all their rows
    by_b: dict[tuple, list] = {}
    for part in parts:
        by_b.setdefault((part[1].tobytes(), part[4].tobytes(), part[5].tobytes()), []).append(part)
    for same in by_b.values():
        rows = np.concatenate([q[0] for q in same])
        if len(np.unique(rows)) < len(rows):
            yield from same
            continue
        first = same[0]
        yield (rows, first[1], np.concatenate([q[2] for q in same]), np.concatenate([q[3] for q in same]),
               first[4], first[5])


__all__ = ["Route", "WarpRoute", "fma_route", "mma_sync_route", "plain_route", "route_key", "route_of", "warp_parts",
           "wgmma_route"]
