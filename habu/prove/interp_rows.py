"""The finite-field interpreter's row and map kernels: every thread of a row kernel walks its chunks
through the lowering's thread map (`RowLowering.thread_map`, `chunk_loop`, `cache`, `passes`), every lane
of a map kernel through its lane map (`MapLowering.lanes`), reading and writing the interpreter's memory
(habu/prove/interp.py runs the kernels; this module is its part for these two families)."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from habu.lower import MapLowering, RowLowering
from habu.lower.rows import RowLoads, canonical_reduction
from habu.prove.conditions import condition_holds
from habu.prove.index_arith import NumpyIndex, wrap
from habu.prove.interp import Memory, PlanFault, eval_pointwise, read, write
from habu.prove.kinds import KindProof, TileAxis, flat_blocks, register_kind, sample_tiles
from habu.spec.ir import Compare, Expr, Load, Op, Reduce


class _Visits:
    """What one block's threads visit of its row, as the lowering's thread map says (`chunk_loop`):
    for every (lane, chunk, element) the loop reaches, the lane t, the chunk g, the element q and the
    column (all blocks of a cluster, each at its part's offset). A map that skips a column, visits one
    twice or runs past the part shows here as a wrong sum, a double store or an access out of bounds."""

    def __init__(self, lw: RowLowering, sizes: Mapping[str, int]):
        loop = lw.chunk_loop(sizes)
        m = lw.thread_map
        if loop.unrolled:
            iters = loop.unrolled
        else:
            if m.chunk_stride < 1:
                raise PlanFault(f"a row thread's chunks are {m.chunk_stride} apart: its column loop never ends")
            iters = -(-(int(loop.end) + 1) // m.chunk_stride)
        t = np.arange(m.threads, dtype=np.int64)[:, None, None]
        g = np.broadcast_to(loop.chunk(t, np.arange(iters, dtype=np.int64)[None, :, None]), (m.threads, iters, 1))
        q = np.arange(loop.vector, dtype=np.int64)[None, None, :]
        shape = (m.threads, iters, loop.vector)
        inside = np.ones(shape, bool) if loop.unrolled else np.broadcast_to(loop.inside(g, _Compare()), shape)
        self.loop = loop
        self.t = np.broadcast_to(t, shape)[inside]
        self.g = np.broadcast_to(g, shape)[inside]
        self.q = np.broadcast_to(q, shape)[inside]
        local = loop.column(self.g, self.q)
        part = lw.columns(sizes)
        ranks = np.arange(lw.kernel.cluster, dtype=np.int64)
        self.cols = (ranks[:, None] * part + local[None, :]).ravel()  # block rank's columns, rank by rank
        self.lane = np.tile(self.t, lw.kernel.cluster)
        self.rank = np.repeat(ranks, len(local))
        self.chunk, self.elem = np.tile(self.g, lw.kernel.cluster), np.tile(self.q, lw.kernel.cluster)


class _Compare:
    """Comparisons on integer arrays (a loop's tail predicate)."""

    def lt(self, a: Any, b: Any) -> np.ndarray:
        return np.asarray(a) < b

    def le(self, a: Any, b: Any) -> np.ndarray:
        return np.asarray(a) <= b


class _KeptRows:
    """The block's on-chip copy of its kept rows (`RowLowering.kept_rows`), as the kernel fills and reads
    it: kept row k is loaded just before pass `loaded_before[k]`, each thread writing its chunks' elements
    to the slots `cache.place(k, g, q)` of a shared-memory cache (per cluster block, each rank its own),
    or to its own registers; every read of a kept row goes through the same slots. A slot map that sends
    two elements to one slot (the later write wins), another row's slots, or past the cache gives some
    column another column's value; a row read before its load reads poison."""

    def __init__(self, name: str, lw: RowLowering, cache, v: _Visits, rows: int, sizes: Mapping[str, int],
                 mem: Memory):
        self.name, self.lw, self.cache, self.v, self.mem, self.rows = name, lw, cache, v, mem, rows
        self.loaded: set[int] = set()
        self.registers: dict[int, np.ndarray] = {}  # a row in registers: each thread's chunks, as loaded
        if cache is None:
            return
        self.length = int(lw.columns(sizes)) * cache.rows  # a cluster rank's slots
        # what each row's cache holds before any load: poison, distinct per slot
        self.buffer = np.broadcast_to(mem.poison(np.arange(lw.kernel.cluster * self.length, dtype=np.int64) + (1 << 40)),
                                      (rows, lw.kernel.cluster * self.length)).copy()

    def _where(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        v = self.v
        slots = np.asarray(self.cache.place(k, v.chunk, v.elem, v.loop), dtype=np.int64)
        outside = (slots < 0) | (slots >= self.length)
        if np.any(outside):
            self.mem.fault(f"{self.name}: the row cache's slot map puts column {int(v.cols[outside][0])} of kept row "
                           f"{k} at slot {int(slots[outside][0])}, outside its {self.length} slots")
        return np.where(outside, 0, v.rank * self.length + slots), outside

    def load(self, k: int, values: np.ndarray) -> None:
        """Kept row k's values (rows × visited columns) written on chip by the threads that load them."""
        self.loaded.add(k)
        if self.cache is None:  # in registers: each thread keeps the chunks it loaded, and reads only those
            self.registers[k] = values
            return
        where, outside = self._where(k)
        self.buffer[:, where[~outside]] = values[:, ~outside]  # the last of colliding writes wins

    def read(self, k: int) -> np.ndarray:
        v = self.v
        if k not in self.loaded:
            self.mem.fault(f"{self.name} reads kept row {k} ({self.lw.kept_rows()[k].tensor}) before it is loaded "
                           "on chip")
        if self.cache is None:
            return self.registers.get(k, np.broadcast_to(self.mem.poison(v.cols)[None, :], (self.rows, len(v.cols))))
        where, outside = self._where(k)
        return np.where(outside[None, :], self.mem.poison(v.cols)[None, :], self.buffer[:, where])


def next_row_copy(name: str, lw: RowLowering, v: _Visits, sizes: Mapping[str, int], mem: Memory,
                  values: list[np.ndarray]) -> list[np.ndarray]:
    """A prefetching block's next-row buffer: every thread copies its chunks of every kept row (`values[k]`,
    rows × visited columns) to the slots `prefetch_layout.slot(k, g)` (16-byte chunks of `vector`
    elements), all rows before any is read back (the copy lands while the previous row is computed);
    then each kept row is read back from its slots. Two rows' chunks in one slot (the later copy wins), or
    a slot past the buffer, give a column another's value or a fault. Each block of a cluster has its own
    buffer (its shared memory): a block rank's slots are apart from the other ranks' here."""
    layout = lw.prefetch_layout
    assert layout is not None
    per_row = int(layout.chunks_per_row(lw, sizes))
    length = len(values) * per_row * lw.kernel.vector  # a block's buffer, in elements: every kept row's part
    buffers = length * lw.kernel.cluster
    buffer = np.broadcast_to(mem.poison(np.arange(buffers, dtype=np.int64) + (1 << 41)),
                             (values[0].shape[0], buffers)).copy() if values else None
    places = []
    for k, row_values in enumerate(values):
        at = np.asarray(layout.slot(k, v.chunk, per_row), dtype=np.int64) * lw.kernel.vector + v.elem
        outside = (at < 0) | (at >= length)
        if np.any(outside):
            mem.fault(f"{name}: the next-row copy puts column {int(v.cols[outside][0])} of kept row {k} at element "
                      f"{int(at[outside][0])}, outside its {length}-element buffer")
        at = np.where(outside, 0, at) + v.rank * length  # (the block's own buffer)
        buffer[:, at[~outside]] = row_values[:, ~outside]  # type: ignore[index]
        places.append((at, outside))
    return [np.where(outside[None, :], mem.poison(v.cols)[None, :], buffer[:, at])  # type: ignore[index]
            for at, outside in places]


def run_rows(name: str, lw: RowLowering, sizes: Mapping[str, int], mem: Memory, blocks: np.ndarray,
             keep: np.ndarray | None = None) -> None:
    """Execute the row kernel's blocks thread by thread through the lowering's thread map: every pass
    reduces what each thread's column loop visits (under the reduction's mask, from the warps the
    block reduction combines), in the lowering's pass order; the kept row goes through its cache."""
    f = mem.field
    m = lw.thread_map
    rows = m.row(blocks[:, None], np.arange(m.rows)[None, :]).ravel()
    if keep is not None:
        rows = rows[np.isin(rows, keep)]
    # a row past the last (the last block's spare row slots) leaves at once (`if (!(r_mask)) return;`): it
    # computes nothing, so its unwritten inputs are never divided by (SOFTMAX-NODES at 17 rows of 4 a block
    # divided by %3's zeros there and the check aborted)
    rows = rows[rows < lw.rows(sizes)]
    C = sizes[lw.c]
    v = _Visits(lw, sizes)
    cols = v.cols
    coords = lw.coordinates(rows[:, None], cols[None, :], sizes)  # through the row → coordinates map
    loads = RowLoads(lw)
    kept, cache = lw.kept_rows(), lw.row_cache(sizes)
    col_mask = (cols < C)[None, :] if lw.reduce_mask else np.ones((1, len(cols)), bool)
    # a block reduction combines the partials of the first `combined_warps` warps only: the columns
    # of a thread in any later warp are lost from every reduction (sum and max alike)
    col_mask = col_mask & (m.warp(v.lane) < lw.combined_warps)[None, :]
    reduced: dict[Expr, np.ndarray] = {}

    def where(bad: np.ndarray, tensor: str = lw.out.tensor) -> str:
        b = np.broadcast_to(bad, (len(rows), len(cols)))
        r = int(rows[np.nonzero(b.any(axis=1))[0][0]])
        return f"row {r} of {tensor}"

    def ev(e: Expr) -> np.ndarray:
        if isinstance(e, Reduce):
            key = canonical_reduction(e)
            if key not in reduced:
                mem.fault(f"{name} reads a reduction over the row that no earlier pass computed ({e.op})")
                return mem.poison(np.arange(len(rows), dtype=np.int64))[:, None]
            return reduced[key]
        if isinstance(e, Load):
            k = lw.kept_index(loads[e])
            if k is not None:
                return on_chip.read(k)
            return read(name, loads[e], coords, sizes, mem, lw.index_width, where)
        if isinstance(e, Op):
            args = [ev(a) for a in e.args]
            args = list(np.broadcast_arrays(*args)) if len(args) > 1 else args
            return f.op(e.fn, [np.asarray(a) for a in args])
        if isinstance(e, Compare):  # over the row axes and the column (habu/lower/rows.py `conditions_on_columns`)
            return np.where(condition_holds(e, coords, sizes, mem), f.const(Fraction(1)), f.const(Fraction(0)))
        return eval_pointwise(e, None, f, sizes)

    on_chip = _KeptRows(name, lw, cache, v, len(rows), sizes, mem)

    def load_kept(index: int) -> None:
        """The kept rows the lowering loads just before pass `index` (len(passes): the store); a prefetching
        block's come back from its next-row copy of every kept row (`next_row_copy`)."""
        if lw.prefetch_layout is not None and index == min(lw.loaded_before, default=-1):
            copied = next_row_copy(name, lw, v, sizes, mem, [np.broadcast_to(
                read(name, acc, coords, sizes, mem, lw.index_width, where), (len(rows), len(cols))) for acc in kept])
            for k in range(len(kept)):
                if lw.loaded_before[k] == index:
                    on_chip.load(k, copied[k])
            return
        for k, acc in enumerate(kept):
            if lw.loaded_before[k] == index:
                values = read(name, acc, coords, sizes, mem, lw.index_width, where)
                on_chip.load(k, np.broadcast_to(values, (len(rows), len(cols))))

    for index, p in enumerate(lw.passes):  # each pass reads only what earlier passes reduced
        load_kept(index)
        body = np.broadcast_to(ev(p.body), (len(rows), len(cols)))
        if p.op == "sum":
            reduced[p] = (np.where(col_mask, body, 0).sum(axis=1, keepdims=True)) % f.p
        else:
            reduced[p] = f.product_last(np.where(col_mask, (f.max_point - body) % f.p, 1))[:, None]
    load_kept(len(lw.passes))
    row_at = lw.row_coordinates(rows[:, None], sizes)
    for st in lw.stats:  # a stored statistic: its one value a row, from each thread the lowering names
        stat = np.broadcast_to(ev(st.value), (len(rows), len(cols)))[:, :1]
        owned = rows[:, None] < lw.rows(sizes)
        for lane, rank in zip(*np.nonzero(st.stores(np.arange(m.threads)[:, None],
                                                    np.arange(lw.kernel.cluster)[None, :])), strict=True):
            write(f"{name} (lane {lane}, cluster block {rank})", st.out, row_at, stat, sizes, mem, lw.index_width,
                  False, owned, lambda bad, t=st.target: where(bad, t))
    value = np.broadcast_to(ev(lw.expression()), (len(rows), len(cols)))
    if lw.per_row:  # a row statistic: one value per row, stored once (by lane 0)
        owned = rows[:, None] < lw.rows(sizes)
        write(name, lw.out, row_at, value[:, :1], sizes, mem, lw.index_width, False, owned, where)
        return
    owned = (rows[:, None] < lw.rows(sizes)) & (cols < C)[None, :]
    write(name, lw.out, coords, value, sizes, mem, lw.index_width, False, owned, where)


def run_map(name: str, lw: MapLowering, sizes: Mapping[str, int], mem: Memory, blocks: np.ndarray,
            keep: np.ndarray | None = None) -> None:
    """Execute the map kernel's blocks lane by lane through the lowering's lane map: lane x of block b
    computes elements `lanes.element(lanes.first(b, x), v)`, v < vector, until the first whose guard
    (every access's mask) fails."""
    f = mem.field
    lm = lw.lanes
    x = np.arange(lm.threads, dtype=np.int64)[None, :, None]
    vv = np.arange(lm.vector, dtype=np.int64)[None, None, :]
    elems = lm.element(lm.first(blocks.astype(np.int64)[:, None, None], x), vv)
    elems = wrap(np.broadcast_to(elems, (len(blocks), lm.threads, lm.vector)).reshape(-1, lm.vector), lw.index_width)
    dims = [sizes[e] for e in lw.extents]
    numel = int(np.prod(dims)) if dims else 1
    # a lane stops at its first element where the guard, every access's mask, fails
    every = lw.coordinates(elems.ravel(), sizes)  # the lowering's decode: what the kernel prints
    guard = np.ones(elems.size, bool)
    for acc in (lw.out, *(a for _, a in lw.loads)):
        guard = guard & np.broadcast_to(acc.mask(every, sizes, NumpyIndex(lw.index_width, mem, name)), guard.shape)
    live = np.cumprod(guard.reshape(elems.shape), axis=1).astype(bool)
    lanes = elems[live]
    if keep is not None:
        lanes = lanes[np.isin(lanes, keep)]
    coords = lw.coordinates(lanes, sizes)
    loads = {ld: acc for ld, acc in lw.loads}
    env: dict[str, np.ndarray] = {}

    def where(bad: np.ndarray) -> str:
        lane = int(lanes[np.nonzero(np.broadcast_to(bad, lanes.shape))[0][0]])
        return f"element {lane} (flat) of {lw.out.tensor}"

    def leaf(ld: Load) -> np.ndarray:
        if ld.tensor in env:
            return env[ld.tensor]
        return read(name, loads[ld], coords, sizes, mem, lw.index_width, where)

    for eq in lw.nodes:
        env[eq.target] = eval_pointwise(eq.rhs, leaf, f, sizes)
    write(name, lw.out, coords, env[lw.nodes[-1].target], sizes, mem, lw.index_width, False, lanes < numel, where)


# ----------------------------------------------------------------------------- the row and map kinds


def _rows_final(lw: RowLowering, sizes: Mapping[str, int]) -> tuple[object, tuple[np.ndarray, ...], str]:
    rb = lw.kernel.rows_per_block
    nblocks = -(-lw.rows(sizes) // rb)
    blocks = np.array(sample_tiles(nblocks), dtype=np.int64)
    rows = np.unique((blocks[:, None] * rb + np.arange(rb)).ravel())
    rows = rows[rows < lw.rows(sizes)]
    if len(lw.leading) > 1:  # the box of the sampled rows' leading coordinates, and every row block it holds
        flat_rows = _flat_rows(lw, _leading_box(lw, rows, sizes), sizes)
        blocks = np.unique(flat_rows // rb)
        rows = flat_rows
    leading = _leading_box(lw, rows, sizes)
    box = (*leading, np.arange(sizes[lw.c])) if not lw.per_row else leading  # a row statistic: one a row
    return blocks, box, f"row blocks {blocks.tolist()} of {nblocks}"


def _leading_box(lw: RowLowering, rows: np.ndarray, sizes: Mapping[str, int]) -> tuple[np.ndarray, ...]:
    """Per leading axis, the coordinates the flattened `rows` have (the lowering's map), each once. The
    check then runs the blocks that hold every row of their box in row-major order: a map that sends a
    row elsewhere leaves some element of the box unwritten or wrong."""
    coords = lw.row_coordinates(rows, sizes)
    out = []
    for a, e in zip(lw.row_axes, lw.leading, strict=True):
        c = np.unique(np.broadcast_to(coords[a], rows.shape))
        out.append(c[(c >= 0) & (c < sizes[e])])  # a wrong map's coordinates past the extent: never the model's
    return tuple(out)


def _flat_rows(lw: RowLowering, leading: tuple[np.ndarray, ...], sizes: Mapping[str, int]) -> np.ndarray:
    """The flattened rows of every combination of the leading coordinates (row-major), sorted."""
    grids = np.meshgrid(*leading, indexing="ij")
    dims = [sizes[e] for e in lw.leading]
    return np.unique(np.ravel_multi_index(tuple(g.ravel() for g in grids), dims)).astype(np.int64)


def _rows_for_box(lw: RowLowering, box: tuple[np.ndarray, ...], sizes: Mapping[str, int]) -> tuple[object, object, str]:
    rows = box[0] if len(lw.leading) == 1 else _flat_rows(lw, box[:len(lw.leading)], sizes)
    blocks = np.unique(rows // lw.kernel.rows_per_block)
    return blocks, rows, f"{len(blocks)} row blocks"


def _rows_axes(name: str, lw: RowLowering) -> list[TileAxis]:
    # flattened rows: every leading extent keeps its class modulo the rows of a block, so the witness's
    # row count does too (B' ≡ B and S' ≡ S give B'·S' ≡ B·S)
    return [*(TileAxis(name, a, e, lw.kernel.rows_per_block) for a, e in zip(lw.row_axes, lw.leading, strict=True)),
            TileAxis(name, "c", lw.c, lw.chunk)]


def _map_final(lw: MapLowering, sizes: Mapping[str, int]) -> tuple[object, tuple[np.ndarray, ...], str]:
    dims = [sizes[e] for e in lw.extents]
    numel = int(np.prod(dims)) if dims else 1
    nblocks = -(-numel // lw.per_block)
    blocks = np.array(sample_tiles(nblocks), dtype=np.int64)
    flat = (blocks[:, None] * lw.per_block + np.arange(lw.per_block)).ravel()
    flat = flat[flat < numel]
    coords = np.unravel_index(flat, dims) if dims else ()
    box = tuple(np.unique(c) for c in coords)
    if dims:  # the box spans elements of other blocks where a block is not whole rows: run those too
        grids = np.meshgrid(*box, indexing="ij")
        blocks = np.unique(np.ravel_multi_index(tuple(g.ravel() for g in grids), dims) // lw.per_block)
    return blocks, box, f"blocks {blocks.tolist()[:8]} of {nblocks}"


def _map_keep(lw: MapLowering, sizes: Mapping[str, int]) -> np.ndarray:
    """The elements the check runs of the final selection's blocks: those of its box, and every lane past the last
    element (their guard must stop them). A block's other elements read an earlier kernel's output outside the
    box the check demanded of it (a 3-D map over dX0[q q2 p] reading a general kernel's %h1[q p]: "reads %h1[2, 0],
    which no earlier kernel wrote", found by a fuzz of backward models); as a general kernel's, they compute what
    the box's elements do."""
    numel = int(np.prod([sizes[e] for e in lw.extents]))
    _, flat, _ = flat_blocks(lw, _map_final(lw, sizes)[1], sizes)  # the box's flat indices
    tail = np.arange(numel, -(-numel // lw.per_block) * lw.per_block, dtype=np.int64)
    return np.union1d(flat, tail)


register_kind(RowLowering, KindProof(run=run_rows, final_selection=_rows_final, box_selection=_rows_for_box,
                                     tiled_axes=_rows_axes))
def _map_axes(name: str, lw: MapLowering) -> list[TileAxis]:
    # a 1-D map's flattened shape is its one extent: its blocks tile it by threads·vector elements
    return [TileAxis(name, "e0", lw.extents[0], lw.per_block)] if len(lw.extents) == 1 else []


# a map kernel's lanes run over the flattened shape: the witness keeps the extents of an N-D one; a 1-D
# one's blocks are tiles of its extent (the first, interior ones, the ragged last: `_map_axes`)
register_kind(MapLowering, KindProof(run=run_map, final_selection=_map_final, box_selection=flat_blocks,
                                     final_keep=_map_keep, tiled_axes=_map_axes,
                                     frozen_extents=lambda lw: lw.extents if len(lw.extents) != 1 else ()))
