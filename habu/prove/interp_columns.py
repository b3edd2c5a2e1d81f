"""Executing a column kernel over GF(p): its selected blocks, every thread, as the emitter prints them.

Each block (tile, split) runs as the kernel does: every thread's columns (`thread_column`), the rows
of its row loop (`row`, masked by `row_end`), its partials written to a modelled shared memory at
`partial_slot` (a slot outside it, or written twice, faults), then the combining threads' slots
(`combine_start`, `combine_step`), each reading every row group's partial at `combined_slot` (a slot
never written reads poison and faults) and storing at `tile_column` — added into the output when the
lowering combines splits atomically, stored otherwise (two splits storing one column are a race the
check names). Loads and the store go through `read`/`write`, which fault out of bounds. An epilogue
(`H[n] = G[n] · 0.5`) is computed from each column's combined value: by the combining thread when one
split stores, else by the tile's last block from the value the splits combined into the output's buffer
(modelled as a buffer of its own). Each block of a launch with a final pass then counts itself on its
tile's counter (`counter_slot`, a slot of the launch's zero-filled workspace: one outside it faults);
the block whose arrival brings a counter to `arrivals` runs the final pass of its own tile
(`final_start`, `final_step` over the tile's slots, `tile_column`): a counter two tiles share finishes
one tile early and another never, and the check names the column that no final pass wrote.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from habu.lower.columns import ColumnLowering
from habu.prove.deadline import check_deadline
from habu.prove.interp import Memory, PlanFault, eval_pointwise, read, write
from habu.prove.kinds import KindProof, TileAxis, register_kind, sample_tiles
from habu.spec.field import PrimeField
from habu.spec.ir import Load


def _reduce(f: PrimeField, op: str, values: np.ndarray, mask: np.ndarray, axes: tuple[int, ...],
            merge: bool = False) -> np.ndarray:
    """Σ or max over `axes` of the values where `mask` holds (the identity where none does). Over GF(p) a
    max is the product of (point − x) over its elements (habu.spec.field), so partial maxima `merge` by
    their product, as partial sums by their sum."""
    values, mask = np.broadcast_arrays(values, mask)
    keep = [a for a in range(values.ndim) if a not in axes]
    order = keep + list(axes)
    shape = (*(values.shape[a] for a in keep), -1)
    flat = np.transpose(values, order).reshape(shape)
    ok = np.transpose(mask, order).reshape(shape)
    if op == "sum":
        return np.where(ok, flat, 0).sum(axis=-1) % f.p
    factors = np.where(ok, flat if merge else (f.max_point - flat) % f.p, 1)
    return f.product_last(factors)


def run_columns(name: str, lw: ColumnLowering, sizes: Mapping[str, int], mem: Memory, blocks,
                keep: np.ndarray | None = None) -> None:
    """Run the blocks `blocks`, (tile, split) pairs, in order (every row split of each tile they name);
    each then counts itself on its tile's counter, and the one completing a count runs the final pass."""
    arrived: dict[int, int] = {}  # the launch's counters (zero-filled before it), by slot
    slots, want = int(lw.counters(sizes)), int(lw.arrivals(sizes))
    for bx, by in blocks:  # launched blocks' grid coordinates, decoded as the kernel decodes them
        check_deadline(f"in {name}'s blocks")  # a column kind's row splits are checked at full size
        tile, split = (int(x) for x in lw.block(int(bx), int(by)))
        _run_block(name, lw, sizes, mem, tile, split)
        if not lw.final_pass:
            continue
        slot = int(lw.counter_slot(tile))
        if not 0 <= slot < slots:
            mem.fault(f"{name}: column tile {tile} counts its row splits on counter {slot}, outside the "
                      f"launch's {slots} counters")
            continue
        arrived[slot] = arrived.get(slot, 0) + 1
        if arrived[slot] == want and lw.epilogue is not None:  # this block is the tile's last: its final pass
            _final_pass(name, lw, sizes, mem, tile)


def _combined_buffer(lw: ColumnLowering):
    """Where the splits combine their partials before the last block's epilogue: the output's buffer,
    modelled apart (the epilogue then overwrites it)."""
    from dataclasses import replace

    return replace(lw.out, tensor="@combined:" + lw.out.tensor)


def _epilogue(name: str, lw: ColumnLowering, value: np.ndarray, col: np.ndarray, sizes: Mapping[str, int],
              mem: Memory, where) -> np.ndarray:
    """The epilogue of the columns `col`, from their reduced `value`; the identity without one."""
    if lw.epilogue is None:
        return value

    def leaf(ld: Load) -> np.ndarray:
        if ld.tensor == lw.reduced:
            return value
        return read(name, lw.access(ld), {"c": col}, sizes, mem, lw.index_width, where)

    return eval_pointwise(lw.epilogue, leaf, mem.field, sizes)


def _final_pass(name: str, lw: ColumnLowering, sizes: Mapping[str, int], mem: Memory, tile: int) -> None:
    """A tile's last block's pass: its threads' slots of the tile (`final_start`, `final_step`), each
    column (`tile_column`, masked by #C) read from the combined buffer, put through the epilogue and
    stored."""
    C = lw.columns(sizes)
    tid = np.arange(lw.thread_map.threads, dtype=np.int64)[:, None]
    step = lw.final_step
    if step <= 0:
        raise PlanFault(f"{name}: the final pass's step is {step}: it never ends")
    q = np.arange(-(-lw.tile // step) + 1, dtype=np.int64)[None, :]
    j = (np.asarray(lw.final_start(tid), dtype=np.int64) + q * step).ravel()
    j = j[(j >= 0) & (j < lw.tile)]
    col = np.asarray(lw.tile_column(tile, j), dtype=np.int64)
    col = col[(col >= 0) & (col < C)]

    def where(bad: np.ndarray) -> str:
        return (f"{lw.out.tensor}[{int(col[np.nonzero(np.broadcast_to(bad, col.shape))[0][0]])}] (column tile "
                f"{tile}'s final pass)")

    buffer = _combined_buffer(lw)
    offsets = np.asarray(buffer.offset({"c": col}, sizes, _Ints()), dtype=np.int64)
    values, written = mem.written[buffer.tensor].read(offsets) if buffer.tensor in mem.written else (
        np.zeros(col.shape, np.int64), np.zeros(col.shape, bool))
    values = np.where(written, values, mem.poison(col + 104729))
    if not np.all(written):
        mem.fault(f"{name}: the last block reads {lw.out.tensor}[{int(col[~written][0])}], which no split combined")
    write(name, lw.out, {"c": col}, _epilogue(name, lw, values, col, sizes, mem, where), sizes, mem, lw.index_width,
          False, col < C, where)


class _Ints:
    """Plain integer arithmetic for an offset the interpreter computes (no wrap: the buffer is modelled)."""

    def cast(self, x):
        return x

    def mul(self, a, b):
        return a * b

    def add(self, a, b):
        return a + b

    def zero(self):
        return 0

    def table(self, name, coordinate):
        raise ValueError(f"a column kernel's output reads no index tensor ({name})")


def _run_block(name: str, lw: ColumnLowering, sizes: Mapping[str, int], mem: Memory, tile: int, split: int) -> None:
    f = mem.field
    tm = lw.thread_map  # the maps as data (habu/lower/column_maps.py): what the emitter prints
    G, Tc, V, U = lw.row_groups, tm.column_threads, tm.vector, tm.unroll

    def where(bad: np.ndarray) -> str:
        return f"{lw.out.tensor}[{tile * lw.tile}] and the rest of its column tile {tile} (row split {split})"

    # thread t is column thread tc of row group g: every (g, tc) of the grid below exactly once
    t = np.arange(tm.threads, dtype=np.int64)
    pairs = np.asarray(tm.row_group(t), dtype=np.int64) * Tc + np.asarray(tm.column_thread(t), dtype=np.int64)
    if len(np.unique(pairs)) != G * Tc or pairs.min() < 0 or pairs.max() >= G * Tc:
        mem.fault(f"{name}: the block's {tm.threads} threads are not its {G} row groups × {Tc} column threads, "
                  f"each once ({where(pairs)})")
    g = np.arange(G, dtype=np.int64).reshape(G, 1, 1, 1, 1)
    i = np.arange(lw.steps, dtype=np.int64).reshape(1, -1, 1, 1, 1)
    u = np.arange(U, dtype=np.int64).reshape(1, 1, U, 1, 1)
    tc = np.arange(Tc, dtype=np.int64).reshape(1, 1, 1, Tc, 1)
    v = np.arange(V, dtype=np.int64).reshape(1, 1, 1, 1, V)
    cols = np.asarray(lw.thread_column(tile, tc, v), dtype=np.int64)
    begin = lw.row_begin(split)
    end = lw.row_end(split, sizes)
    rows = np.asarray(lw.row(begin, i, u, g), dtype=np.int64)
    in_rows = np.asarray(lw.row_live(rows, end), dtype=bool)
    coords = {**lw.row_coordinates(rows, sizes), "c": cols}  # through the row → coordinates map

    def leaf(ld: Load) -> np.ndarray:
        return read(name, lw.access(ld), coords, sizes, mem, lw.index_width, where)

    body = eval_pointwise(lw.body, leaf, f, sizes)
    partial = _reduce(f, lw.op, body, in_rows, (1, 2))  # (G, Tc, V): each thread's partial of each column
    partial = np.broadcast_to(partial, (G, Tc, V))

    # shared memory: every thread writes its partials
    slots = np.asarray(lw.partial_slot(g.reshape(G, 1, 1), tc.reshape(1, Tc, 1), v.reshape(1, 1, V)), dtype=np.int64)
    slots = np.broadcast_to(slots, partial.shape)
    smem = np.zeros(lw.partials, dtype=np.int64)
    written = np.zeros(lw.partials, dtype=np.int64)
    outside = (slots < 0) | (slots >= lw.partials)
    if np.any(outside):
        mem.fault(f"{name}: a thread writes shared-memory partial {int(slots[outside].flat[0])}, outside the "
                  f"block's {lw.partials} ({where(outside)})")
    inside = ~outside
    np.add.at(written, slots[inside], 1)
    if np.any(written > 1):
        mem.fault(f"{name}: two threads write shared-memory partial {int(np.nonzero(written > 1)[0][0])} "
                  f"(a race; {where(written)})")
    smem[slots[inside]] = partial[inside]

    # the combining threads: slot j of the tile, every row group's partial of it
    tid = np.arange(tm.threads, dtype=np.int64)[:, None]
    step = lw.combine_step
    if step <= 0:
        raise PlanFault(f"{name}: the combine loop's step is {step}: it never ends")
    q = np.arange(-(-lw.tile // step) + 1, dtype=np.int64)[None, :]
    j = np.asarray(lw.combine_start(tid), dtype=np.int64) + q * step
    j = j[(j < lw.tile) & (j >= 0)]
    if not len(j):
        return
    gs = np.arange(G, dtype=np.int64)[:, None]
    read_slots = np.asarray(lw.combined_slot(gs, j[None, :]), dtype=np.int64)
    read_slots = np.broadcast_to(read_slots, (G, len(j)))
    bad = (read_slots < 0) | (read_slots >= lw.partials)
    safe = np.where(bad, 0, read_slots)
    unwritten = bad | (written[safe] == 0)
    if np.any(unwritten):
        mem.fault(f"{name}: the combine reads shared-memory partial {int(read_slots[unwritten].flat[0])}, which "
                  f"no thread wrote ({where(unwritten)})")
    values = np.where(unwritten, mem.poison(read_slots + 7919 * tile), smem[safe])
    combined = _reduce(f, lw.op, values, np.ones(values.shape, bool), (0,), merge=True)
    col = np.asarray(lw.tile_column(tile, j), dtype=np.int64)
    owned = (col >= tile * lw.tile) & (col < (tile + 1) * lw.tile) & (col < lw.columns(sizes))
    merge = {"atomic": True, "atomic-max": "max"}.get(lw.combine, False)  # added, maxed, or stored
    if lw.final_pass and lw.epilogue is not None:  # the last block computes the epilogue from these
        write(name, _combined_buffer(lw), {"c": col}, combined, sizes, mem, lw.index_width, merge, owned, where)
        return
    stored = _epilogue(name, lw, combined, col, sizes, mem, where) if lw.combine == "store" else combined
    write(name, lw.out, {"c": col}, stored, sizes, mem, lw.index_width, merge, owned, where)


# ----------------------------------------------------------------------------- the column kind


def column_selection(lw: ColumnLowering, tiles: list[int], sizes: Mapping[str, int]
                     ) -> tuple[object, tuple[np.ndarray, ...], str]:
    """A column kernel's blocks for column tiles `tiles`: every row split of each (a column's value is
    the sum of its splits'), and the columns they cover."""
    splits = int(lw.splits(sizes))
    blocks = [(t, s) for t in tiles for s in range(splits)]
    cols = np.unique(np.concatenate([np.arange(t * lw.tile, min((t + 1) * lw.tile, lw.columns(sizes))) for t in tiles]))
    # the box over the stored tensor's positions: the columns, and every row of a broadcast shape's size-1 extents
    # (`dB[0 n]`: row 0), from the tensor's extents, not from the row the lowering stores at
    box = tuple(cols if p.kind == "axis" else np.arange(sizes[e]) for p, e in zip(lw.out.positions, lw.out.extents,
                                                                                 strict=True)) if lw.c else ()
    return blocks, box or (cols,), f"column tiles {tiles} of {int(lw.tiles(sizes))}, all {splits} row split(s)"


def _columns_for_box(lw: ColumnLowering, box: tuple[np.ndarray, ...], sizes: Mapping[str, int]
                     ) -> tuple[object, object, str]:
    # a scalar's box has no axis (a reduction over every axis: max r c abs(X[r c])): its one column tile
    tiles = np.unique(box[lw.column_position] // lw.tile).tolist() if box else list(range(int(lw.tiles(sizes))))
    blocks, _, text = column_selection(lw, tiles, sizes)
    return blocks, None, text


register_kind(ColumnLowering, KindProof(
    run=run_columns, box_selection=_columns_for_box,
    final_selection=lambda lw, sizes: column_selection(lw, sample_tiles(int(lw.tiles(sizes))), sizes),
    # its column tiles are independent, one class per (first, last, valid columns) as a contraction's tiles;
    # over one leading axis its row splits are tiles of it too (the first, interior ones, the ragged last,
    # each running the same row loop); rows flattened from several axes are checked at full size
    tiled_axes=lambda name, lw: [TileAxis(name, "c", lw.c, lw.tile)] * bool(lw.c) + [
        TileAxis(name, "r", lw.leading[0], lw.thread_map.rows_per_split)] * (len(lw.leading) == 1),
    frozen_extents=lambda lw: tuple(lw.leading) if len(lw.leading) > 1 else ()))
