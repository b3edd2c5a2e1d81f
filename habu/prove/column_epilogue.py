"""The finite-field check of a column sum in a contraction's epilogue (habu/lower/column_epilogue.py), thread by
thread as the kernel runs it: each consumer thread adds the values it holds of each of its columns (the
lowering's accumulator fragment and slab rows; rows past #M only where the planted `mask_rows` is off), the
lanes combine by the lowering's xor shuffles, the writers put their warp's sums at the lowering's slots (a slot
outside its warpgroup's buffers, misaligned or written twice faults), and each finishing thread adds the slots
of its column over every warp and stores the finished value through the output's access (an unwritten slot
reads poison). A shuffle that misses a lane or mixes columns, a writer too many or too few, or a padding row
added all give wrong sums, which the comparison with the reference finds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from habu.lower.column_epilogue import COLUMN_SUM, SLOT_BYTES
from habu.lower.contraction import ContractionLowering
from habu.spec.ir import Load, Model


def column_boxes(model: Model, lw: Any, box: tuple[np.ndarray, ...]) -> dict[str, tuple[np.ndarray, ...]]:
    """The box of each column node a contraction kernel computes, from its output's box (the columns along n;
    row 0 of a size-1 extent), or {} for other kernels. `box` () names them only."""
    cs = getattr(lw, "column_sum", None)
    if not isinstance(lw, ContractionLowering) or cs is None:
        return {}
    if not box:
        return {t: () for t in cs.nodes}
    cols = box[[p.axis for p in lw.out.positions if p.kind == "axis"].index("n")]
    out: dict[str, tuple[np.ndarray, ...]] = {}
    for t in cs.nodes:
        extents = model.tensor(t).extents
        out[t] = (cols,) if len(extents) == 1 else tuple(
            cols if p.kind == "axis" else np.array([p.value], dtype=np.int64) for p in cs.out.positions)
    return out


def run_column_sum(name: str, lw: ContractionLowering, value: np.ndarray, mc: np.ndarray, nc: np.ndarray,
                   sizes: Mapping[str, int], mem: Any) -> None:
    """The epilogue's column sum of `value` (blocks, BM, BN: the chain's end over each block's whole tile, rows
    `mc` and columns `nc`), finished and stored as the kernel does."""
    from habu.prove.interp import eval_pointwise, write  # (interp runs this module's check)

    cs, frag, st, f = lw.column_sum, lw.fragment, lw.tma_store, mem.field
    assert cs is not None
    if st is None or value.shape[1:] != (lw.bm, lw.bn):
        mem.fault(f"{name}: the column sum of {cs.out.tensor} runs without its TMA-store epilogue's whole tiles")
        return
    blocks = value.shape[0]
    cw, warp, lane, j, q = np.ix_(np.arange(cs.consumers), np.arange(cs.warps), np.arange(frag.warp_size),
                                  np.arange(lw.bn // frag.col_step), np.arange(frag.pair))
    shape = np.broadcast_shapes(cw.shape, warp.shape, lane.shape, j.shape, q.shape)
    partial = np.zeros((blocks, *shape), dtype=np.int64)
    for s in range(st.slabs):
        for h in range(frag.halves):
            row, col = frag.element(warp, lane, j, h, q)
            row = np.broadcast_to(st.slab_row(cw, s) + row, shape)
            col = np.broadcast_to(col, shape)
            inside = (row >= 0) & (row < lw.bm) & (col >= 0) & (col < lw.bn)
            if not inside.all():
                mem.fault(f"{name}: the column sum reads a register outside the {lw.bm}x{lw.bn} tile")
            r, c = np.clip(row, 0, lw.bm - 1), np.clip(col, 0, lw.bn - 1)
            v = value[:, r, c]
            if cs.mask_rows:  # rows past #M (the tile's padding) add nothing
                v = np.where(mc[:, r] < sizes[lw.m], v, 0)
            partial = (partial + v) % f.p
    lanes = np.arange(frag.warp_size)
    for x in cs.shuffles:
        if not 0 < x < frag.warp_size:
            mem.fault(f"{name}: the column sum shuffles with lane mask {x}, outside the warp")
            continue
        partial = (partial + partial[:, :, :, lanes ^ x]) % f.p
    # the writers' slots: lanes below `writers` store each of their columns' sums
    writer = np.broadcast_to(lane < cs.writers, shape)
    column = np.broadcast_to(frag.element(warp, lane, j, 0, q)[1], shape)
    slot = np.broadcast_to(cs.slot(cw, warp, column), shape)
    own_lo = np.broadcast_to(cs.base + cw * cs.warpgroup_stride, shape)
    placed = slot[writer]
    if np.any(placed % SLOT_BYTES) or np.any(placed < own_lo[writer]) or np.any(placed >= own_lo[writer] + cs.region):
        mem.fault(f"{name}: a column-sum partial lands outside its warpgroup's TMA-store buffers or misaligned")
    slots, counts = np.unique(placed, return_counts=True)
    if np.any(counts > 1):
        twice = int(slots[counts > 1][0])
        at = int(nc[0, int(column[writer][placed == twice][0])])  # the column whose partial is written twice
        where = ", ".join(str(p.value) if p.kind == "const" else str(at) for p in cs.out.positions)
        mem.fault(f"{name}: two lanes write the column-sum partial of {cs.out.tensor}[{where}] at shared byte {twice}")
    smem = dict(zip(placed.tolist(), range(len(placed)), strict=True))
    stored = partial[:, writer]  # (blocks, writers' values), in `placed`'s order
    # the finishing threads: thread t sums its column's slots over every warpgroup and warp
    t = np.arange(cs.consumers * 128)
    col_t = cs.finisher_column(t)
    col_t = col_t[col_t < lw.bn]
    total = np.zeros((blocks, len(col_t)), dtype=np.int64)
    for w_cw in range(cs.consumers):
        for w in range(cs.warps):
            at = cs.slot(w_cw, w, col_t)
            idx = np.array([smem.get(int(a), -1) for a in at], dtype=np.int64)
            got = np.where(idx[None, :] >= 0, stored[:, np.maximum(idx, 0)],
                           mem.poison(np.broadcast_to(at, (blocks, len(col_t))).astype(np.int64)))
            total = (total + got) % f.p
    finished = eval_pointwise(cs.finish, lambda ld: total if ld == Load(COLUMN_SUM, ()) else _unread(ld), f, sizes)
    n = nc[:, col_t]
    write(name, cs.out, {"n": n}, finished, sizes, mem, lw.index_width, False, n < sizes[lw.n])


def _unread(ld: Load) -> np.ndarray:
    raise ValueError(f"a column sum's finish reads {ld.tensor}: only the sum and constants")


__all__ = ["column_boxes", "run_column_sum"]
