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


def column_demand(lw: Any, boxes: dict[str, tuple[np.ndarray, ...]], sizes: Mapping[str, int],
                  own: tuple[np.ndarray, ...] | None) -> tuple[np.ndarray, ...] | None:
    """The box of a contraction kernel's output whose blocks compute what later kernels demand of it: `own` (its
    output's), widened by the columns they demand of its column nodes (`%rdB2[d]` read by another kernel), every
    row (a column sum adds them all); `own` for a kernel without a column sum."""
    cs = getattr(lw, "column_sum", None)
    if not isinstance(lw, ContractionLowering) or cs is None:
        return own
    wanted = [b[next(i for i, p in enumerate(cs.out.positions) if p.kind == "axis")] if len(b) > 1 else b[0]
              for t in cs.nodes if (b := boxes.get(t)) is not None]
    if not wanted:
        return own
    axes = [p.axis for p in lw.out.positions]
    cols = np.unique(np.concatenate([*wanted, *([own[axes.index("n")]] if own is not None else [])]))
    rows = np.arange(sizes[lw.m])
    return tuple(rows if a == "m" else cols for a in axes)


def column_tile_sums(name: str, lw: ContractionLowering, value: np.ndarray, mc: np.ndarray, nc: np.ndarray,
                     sizes: Mapping[str, int], mem: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The epilogue's column sum of `value` (blocks, BM, BN: the chain's end over each block's whole tile, rows `mc`
    and columns `nc`) as each block's threads add it up: (its sums (blocks, columns), `mc`, the columns' coordinates
    (blocks, columns)); None where the plan cannot run the sum. `finish_column_sums` of every block the launch runs,
    at once, finishes and stores them (the tile rows' sums meet in one workspace)."""
    cs, frag, st, f = lw.column_sum, lw.fragment, lw.tma_store, mem.field
    assert cs is not None
    if st is None or value.shape[1:] != (lw.bm, lw.bn):
        mem.fault(f"{name}: the column sum of {cs.out.tensor} runs without its TMA-store epilogue's whole tiles")
        return None
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
    partial = _through_registers(name, cs, partial, lw.bn // frag.col_step, frag.pair, mem)
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
        mem.fault(f"{name}: two lanes write the column-sum partial of {_element(cs, at)} at shared byte {twice}")
    smem = dict(zip(placed.tolist(), range(len(placed)), strict=True))
    stored = partial[:, writer]  # (blocks, writers' values), in `placed`'s order
    # the finishing threads: thread t sums its columns' slots (round by round) over every warpgroup and warp
    t = np.arange(cs.finishers)
    col_t = np.concatenate([np.asarray(cs.finisher_column(t, i)) for i in range(cs.finisher_rounds)])
    col_t = col_t[col_t < lw.bn]
    total = np.zeros((blocks, len(col_t)), dtype=np.int64)
    for w_cw in range(cs.consumers):
        for w in range(cs.warps):
            at = cs.slot(w_cw, w, col_t)
            idx = np.array([smem.get(int(a), -1) for a in at], dtype=np.int64)
            got = np.where(idx[None, :] >= 0, stored[:, np.maximum(idx, 0)],
                           mem.poison(np.broadcast_to(at, (blocks, len(col_t))).astype(np.int64)))
            total = (total + got) % f.p
    return total, mc, nc[:, col_t]


def finish_column_sums(name: str, lw: ContractionLowering, total: np.ndarray, mc: np.ndarray, n: np.ndarray,
                       sizes: Mapping[str, int], mem: Any) -> None:
    """The blocks' column sums (`column_tile_sums` of every block the launch runs) combined over the tile rows where
    the plan combines them, finished and stored."""
    from habu.prove.interp import eval_pointwise, write  # (interp runs this module's check)

    cs, f = lw.column_sum, mem.field
    assert cs is not None
    if cs.combine:  # the tile rows' sums meet in the launch's workspace; each column tile's last block finishes
        total, n = _combined(name, lw, total, mc, n, sizes, mem)
        if not len(n):
            return
    finished = eval_pointwise(cs.finish, lambda ld: total if ld == Load(COLUMN_SUM, ()) else _unread(ld), f, sizes)
    write(name, cs.out, {"n": n}, finished, sizes, mem, lw.index_width, False, n < sizes[lw.n])


def _through_registers(name: str, cs: Any, partial: np.ndarray, groups: int, pair: int, mem: Any) -> np.ndarray:
    """The thread's sums kept in its registers `register(j, q)` (`colsum[]`): the value each (group j, pair q) reads
    back is the sum of every (j', q') added into its register, so two columns on one register mix; a register past
    the array faults."""
    count = cs.registers(groups)
    regs = np.zeros((*partial.shape[:-2], count), dtype=np.int64)
    at = {}
    for j in range(groups):
        for q in range(pair):
            at[j, q] = r = int(cs.register(j, q))
            if not 0 <= r < count:
                mem.fault(f"{name}: the column sum keeps group {j}'s column {q} in register {r} of {count}")
                continue
            regs[..., r] = (regs[..., r] + partial[..., j, q]) % mem.field.p
    out = np.zeros_like(partial)
    for (j, q), r in at.items():
        out[..., j, q] = regs[..., r] if 0 <= r < count else mem.poison(np.full(partial.shape[:-2], r, np.int64))
    return out


def _combined(name: str, lw: ContractionLowering, total: np.ndarray, mc: np.ndarray, n: np.ndarray,
              sizes: Mapping[str, int], mem: Any) -> tuple[np.ndarray, np.ndarray]:
    """The blocks (tile rows tm, column tiles tn) in turn: each stores its sums at `partial_offset(tm, n)` of the
    workspace (poison where no block wrote), counts itself on `counter_slot(tn)`, and the block that brings the
    count to `arrivals` adds every tile row's sums of its columns; the counters must be back at `counter_after`.
    (The finishing blocks' totals and columns, for the finish and the store.)"""
    cs, f = lw.column_sum, mem.field
    assert cs is not None
    tms, rows = int(cs.arrivals(sizes)), sizes[lw.m]
    tiles_n = -(-sizes[lw.n] // lw.bn)
    slots = tms * sizes[lw.n]
    parts = mem.poison(np.arange(slots, dtype=np.int64) * 7907 + 3)
    counters = np.zeros(tiles_n, dtype=np.int64)
    every_slot = np.asarray(cs.partial_offset(np.arange(tms, dtype=np.int64)[:, None],
                                              np.arange(sizes[lw.n], dtype=np.int64)[None, :], sizes))
    if len(np.unique(every_slot)) != every_slot.size:
        mem.fault(f"{name}: two tile rows' column sums share a slot of the workspace (a race between blocks)")
    tm_of, tn_of = mc[:, 0] // lw.bm, n[:, 0] // lw.bn
    out_t, out_n = [], []
    # tile row by tile row, across the column tiles (the blocks of a column tile interleaved with the others', as
    # the GPU may run them): a counter two column tiles share counts the one's blocks for the other
    for b in np.lexsort((tn_of, tm_of)):
        inside = n[b] < sizes[lw.n]
        at = np.asarray(cs.partial_offset(tm_of[b], n[b], sizes), dtype=np.int64)
        if np.any(inside & ((at < 0) | (at >= slots))):  # (the columns past #N are masked: no store)
            mem.fault(f"{name}: a tile row's column sums land outside the workspace of {tms} × #{lw.n} sums")
        ok = inside & (at >= 0) & (at < slots)
        parts[at[ok]] = total[b][ok]
        slot = int(cs.counter_slot(tn_of[b]))
        if not 0 <= slot < tiles_n:
            mem.fault(f"{name}: column tile {int(tn_of[b])} counts itself outside the {tiles_n} counters")
            continue
        counters[slot] += 1
        if counters[slot] == cs.arrivals(sizes):  # the last block of the column tile finishes its columns
            every = np.stack([np.asarray(cs.partial_offset(np.int64(t), n[b], sizes), dtype=np.int64)
                              for t in range(tms)])
            ok = (every >= 0) & (every < slots)
            if np.any(inside[None, :] & ~ok):
                mem.fault(f"{name}: the finishing block reads column sums outside the workspace")
            got = np.where(ok, parts[np.clip(every, 0, slots - 1)], mem.poison(every * 31 + 7))
            out_t.append(got.sum(axis=0) % f.p)
            out_n.append(n[b])
            counters[slot] = cs.counter_after()
    if np.any(counters != 0):
        tn = int(np.nonzero(counters != 0)[0][0])
        mem.fault(f"{name}: the counter of the column tile from {_element(cs, tn * lw.bn)} is left at "
                  f"{int(counters[tn])}, not 0, for the next launch (#{lw.m} = {rows} in tiles of {lw.bm})")
    if not out_t:
        return total[:0], n[:0]
    return np.stack(out_t), np.stack(out_n)


def _element(cs: Any, n: int) -> str:
    """The output element of column n, named (row 0 of a bias's broadcast shape)."""
    return f"{cs.out.tensor}[{', '.join(str(p.value) if p.kind == 'const' else str(n) for p in cs.out.positions)}]"


def _unread(ld: Load) -> np.ndarray:
    raise ValueError(f"a column sum's finish reads {ld.tensor}: only the sum and constants")


__all__ = ["column_boxes", "column_tile_sums", "finish_column_sums"]
