"""Lowering the column family: `T[c] = op r body(r, c)`, one reduction over the leading axis.

Block (tile, split) = (blockIdx.x, blockIdx.y) owns the columns tile·W .. tile·W + W − 1 (W =
column_threads · vector, the block's tile) and the rows of its split, split·S .. min(split·S + S, #R) − 1
(S = rows_per_split). Thread t is column thread tc = t % column_threads of row group g = t / column_threads;
it owns the `vector` adjacent columns tile·W + tc·vector + v (one 16-byte load of bf16 is 8) and visits
rows begin + i·G·U + u·G + g (G row groups, U = unroll rows loaded before they are added), masked by the
split's end. It accumulates in f32, writes its partials to shared memory at `partial_slot(g, tc, v)`;
then thread t combines the tile's slots j = t, t + threads, ... over the row groups (`combined_slot(g, j)`)
and stores column tile·W + j: directly with one split, added atomically (f32) into the zeroed output with
several. Several reduced leading axes (`G[n] = Σ b Σ s dY[b s n]`) are one row axis of #B·#S rows, each
access reading the leading coordinates of row r through `row_coordinates` (habu/lower/flatten.py). Every
one of these maps is a method here, reading the strides and counts held as data in
habu/lower/column_maps.py (`thread_map`, `partial_map`): the finite-field interpreter
(`habu.prove.interp_columns`) runs them, the rules (`habu.prove.rules_columns`) bound them, and the
emitter (`habu.emit_cuda.emit_columns`) prints them, so a map that skips or double-counts a row or a
column fails the check.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from habu.lower.access import Access, VectorAccess, access_for, cdiv
from habu.lower.column_maps import ColumnPartials, ColumnThreadMap, column_maps
from habu.lower.flatten import FlattenedRows, row_axis_names, row_count
from habu.plan.patterns import as_column_reduction, column_parts, column_region, epilogue_column, inline_nodes
from habu.plan.plan import ColumnKernel
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Equation, Expr, IndexConst, IndexVar, Load, Model, Reduce, rename_vars, walk

# element types a row's columns are loaded as packed vectors of (4, 8 or 16 bytes)
VECTOR_DTYPES = ("bf16", "f16", "f32")
VECTOR_BYTES = (4, 8, 16)


@dataclass(frozen=True)
class ColumnLowering(FlattenedRows):
    kernel: ColumnKernel
    leading: tuple[str, ...]  # the reduced (leading) extents, outermost first: rows are their flattening
    c: str  # the column extent: the output's; "" for a scalar output (one column)
    op: str  # "sum" or "max"
    node: Equation  # the last node, its prologue nodes inlined; lhs renamed to c, the reduction variable to r
    loads: tuple[tuple[Load, Access], ...]  # every load of the body, once
    out: Access
    # "atomic": row splits add into the zeroed output (f32 atomicAdd); "atomic-max": row splits take the max
    # into it (habu::atomic_max_ordered on order-preserving integer keys, decoded by the launch's last block);
    # "store": each split stores
    combine: str
    index_width: int
    # the maps below as data (habu/lower/column_maps.py): the methods read their strides
    thread_map: ColumnThreadMap
    partial_map: ColumnPartials
    # the epilogue (`H[n] = G[n] · 0.5`): the stored value of each column as an expression of the
    # reduction's (the load of `reduced` at [c]) and of per-column loads (`epi_loads`); None: the
    # reduction itself is stored. With atomic splits the reduction goes into the output's f32 buffer and
    # each column tile's last row split to finish (`habu::last_block_done` on the tile's counter) computes
    # the epilogue there, in place.
    epilogue: Expr | None = None
    reduced: str = ""
    epi_loads: tuple[tuple[Load, Access], ...] = ()

    # -- shape of the block
    @property
    def nodes(self) -> tuple[Equation, ...]:
        return (self.node,)

    @property
    def extents(self) -> tuple[str, ...]:
        return (self.c,) if self.c else ()

    @property
    def body(self) -> Expr:
        rhs = self.node.rhs
        assert isinstance(rhs, Reduce)
        return rhs.body

    @property
    def column_position(self) -> int:
        """The stored tensor's position that holds the column: 0, or its place among a broadcast shape's row-0
        positions (`dB[0 n]`: 1)."""
        return next((i for i, p in enumerate(self.out.positions) if p.kind == "axis"), 0)

    @property
    def row_groups(self) -> int:
        return self.thread_map.row_groups

    @property
    def tile(self) -> int:
        """Columns one block owns: column_threads · vector (also the shared-memory slots per row group)."""
        return self.thread_map.tile_columns

    @property
    def partials(self) -> int:
        """Floats of shared memory a block holds: one partial per row group and column of its tile."""
        return self.partial_map.slots

    @property
    def smem_bytes(self) -> int:
        """Static shared memory a block declares: the partials, and the last-block flag of a launch with a
        final pass (`habu::last_block_done`, one word)."""
        return 4 * self.partials + (4 if self.final_pass else 0)

    @property
    def steps(self) -> int:
        """Iterations of a thread's row loop: each loads `unroll` rows, G apart."""
        return self.thread_map.steps

    def columns(self, sizes: Mapping[str, Any]) -> Any:
        """The output's columns: #C, or 1 for a scalar output."""
        return sizes[self.c] if self.c else 1

    def tiles(self, sizes: Mapping[str, Any]) -> Any:
        return cdiv(self.columns(sizes), self.tile)

    def splits(self, sizes: Mapping[str, Any]) -> Any:
        return cdiv(self.rows(sizes), self.thread_map.rows_per_split)

    def grid(self, sizes: Mapping[str, Any]) -> tuple[Any, Any]:
        """Blocks launched: (column tiles, row splits), grid.x and grid.y."""
        return self.tiles(sizes), self.splits(sizes)

    # -- the maps (ints, numpy arrays, z3 terms or C expressions alike)
    def thread_column(self, tile: Any, tc: Any, v: Any) -> Any:
        """The column of element v of column thread tc's vector in column tile `tile`."""
        return self.thread_map.thread_column(tile, tc, v)

    def block(self, bx: Any, by: Any) -> tuple[Any, Any]:
        """(column tile, row split) of the block at grid coordinates (bx, by): the grid is `grid`."""
        return self.thread_map.block(bx, by)

    def row_live(self, r: Any, end: Any) -> Any:
        """Whether row r is one of its split's rows (those before `end`, the split's `row_end`)."""
        return self.thread_map.row_live(r, end)

    def row_begin(self, split: Any) -> Any:
        return self.thread_map.row_begin(split)

    def row_end(self, split: Any, sizes: Mapping[str, Any]) -> Any:
        """The end (exclusive) of a split's rows: S rows on, or #R for the last split."""
        return self.thread_map.row_end(split, self.rows(sizes))

    def row(self, begin: Any, i: Any, u: Any, g: Any) -> Any:
        """The row row group g loads as the u-th of iteration i: begin + i·G·U + u·G + g."""
        return self.thread_map.row(begin, i, u, g)

    def partial_slot(self, g: Any, tc: Any, v: Any) -> Any:
        """Where thread (g, tc) writes its partial of its column v in shared memory."""
        return self.partial_map.partial_slot(g, tc, v)

    def combined_slot(self, g: Any, j: Any) -> Any:
        """Where the combining thread reads row group g's partial of its tile's column j."""
        return self.partial_map.combined_slot(g, j)

    def tile_column(self, tile: Any, j: Any) -> Any:
        """The column of slot j of column tile `tile` (where the combined value is stored)."""
        return self.thread_map.tile_column(tile, j)

    def combine_start(self, tid: Any) -> Any:
        """Thread tid combines slots tid, tid + combine_step, ... below `tile`."""
        return self.partial_map.combine_start(tid)

    @property
    def combine_step(self) -> int:
        return self.partial_map.combine_step

    @property
    def final_pass(self) -> bool:
        """Each column tile's last row split to finish revisits the tile's columns once all its splits are
        in: to decode a max's keys, or to compute the epilogue from the reduction the splits added into
        the output."""
        return self.combine == "atomic-max" or (self.combine == "atomic" and self.epilogue is not None)

    def final_start(self, tid: Any) -> Any:
        """Thread tid of a tile's last block finishes the tile's slots tid, tid + final_step, ... below
        `tile` (column `tile_column(tile, j)`, masked by #C)."""
        return self.thread_map.final_start(tid)

    @property
    def final_step(self) -> int:
        return self.thread_map.final_step

    # -- the per-launch counters that find each tile's last block (a workspace of the launch)
    @property
    def counter_tensor(self) -> str:
        """The counters' buffer: a workspace the runtime allocates for each launch (in the stream's order,
        so launches on two streams never share one) and zero-fills before it; "" without a final pass.
        Named after the output ("$G"), which no other kernel of a plan writes."""
        return "$" + self.out.tensor if self.final_pass else ""

    @property
    def counter_extents(self) -> tuple[str, ...]:
        """The counters' shape as extent tokens: ⌈#C / tile⌉ slots ("N/256"), one for a scalar output."""
        return (f"{self.c}/{self.tile}",) if self.c else ()

    def counters(self, sizes: Mapping[str, Any]) -> Any:
        """Slots of the counters' buffer: the size of `counter_extents`."""
        return self.tiles(sizes)

    def counter_slot(self, tile: Any) -> Any:
        """The slot column tile `tile`'s row splits count themselves on."""
        return self.thread_map.counter_slot(tile)

    def arrivals(self, sizes: Mapping[str, Any]) -> Any:
        """Blocks that count themselves on a tile's counter: its row splits; the one that brings the count
        to this is the tile's last block."""
        return self.splits(sizes)

    # -- loads
    def kind_of(self, acc: Access) -> str:
        """"row-column" (reads [r c]), "column-row" (reads [c r]: a transposed reduction, `O[b] = Σ i X[b i]`
        with the rows i split over the grid; loaded element by element, a warp's lanes on adjacent rows),
        "column" (reads [c]) or "row" (reads [r])."""
        axes = tuple(p.axis for p in acc.positions)
        rows = self.row_axes
        if not self.c:  # a scalar output: its loads read rows, or one value (its column's)
            return {rows: "row", (): "column"}[axes]
        return {(*rows, "c"): "row-column", ("c", *rows): "column-row", ("c",): "column", rows: "row"}[axes]

    def vectorized(self, acc: Access) -> bool:
        """A row-column load moved as one packed vector of `vector` elements (4, 8 or 16 bytes)."""
        v = self.thread_map.vector
        return (self.kind_of(acc) == "row-column" and v > 1 and acc.dtype in VECTOR_DTYPES
                and v * DTYPES[acc.dtype].bytes in VECTOR_BYTES)

    def vector_accesses(self) -> tuple[VectorAccess, ...]:
        """The packed vector loads the kernel makes: the launch checks each tensor's base alignment."""
        v = self.thread_map.vector
        return tuple(VectorAccess(acc.tensor, v, f"the plan reads {v} adjacent columns of {acc.tensor} at once")
                     for _, acc in self.loads if self.vectorized(acc))

    def access(self, ld: Load) -> Access:
        return next(a for x, a in (*self.loads, *self.epi_loads) if x == ld)


def lower_columns(model: Model, kernel: ColumnKernel, storage: Mapping[str, str] | None = None) -> ColumnLowering:
    eq, epilogue_nodes = column_parts(model, kernel.nodes)  # the elementwise prologue nodes inlined
    col = as_column_reduction(eq)
    if col is None and eq.scatter is not None:
        raise ValueError(f"{eq.target} is a scatter-add (`{eq.target}[…] +=`): the column family stores "
                         "each column at its own index")
    if col is None:
        raise ValueError(f"{eq.target} is not a reduction over the leading axis of its inputs")
    if epilogue_nodes and column_region(model, kernel.nodes) is None:
        raise ValueError(f"{', '.join(e.target for e in epilogue_nodes)} after {eq.target} is no epilogue the column "
                         f"family runs along {eq.target}'s columns")
    leading = tuple(v.extent for v in col.rs)
    rvs = tuple(IndexVar(a, e) for a, e in zip(row_axis_names(len(leading)), leading, strict=True))
    c_extent = col.n.extent if col.n is not None else ""  # "": a scalar output, one column
    cv = IndexVar("c", c_extent)
    rhs = col.node.rhs
    assert isinstance(rhs, Reduce)
    mapping = {**({col.n: cv} if col.n is not None else {}), **dict(zip(col.rs, rvs, strict=True))}
    out_index = (cv,) if col.n is not None else ()
    node = Equation(eq.target, out_index, Reduce(rhs.op, rvs, rename_vars(rhs.body, mapping)))
    extent_of_axis = {**{v.name: v.extent for v in rvs}, "c": c_extent}
    axis_of = {**{v: v.name for v in rvs}, cv: "c"}
    loads: list[tuple[Load, Access]] = []
    for x in walk(node.rhs):
        if isinstance(x, Load) and not any(x == ld for ld, _ in loads):
            loads.append((x, access_for(model.tensor(x.tensor), x.indices, axis_of, extent_of_axis, storage)))
    epilogue: Expr | None = None
    epi_loads: list[tuple[Load, Access]] = []
    if epilogue_nodes:
        last = epilogue_nodes[-1]
        inlined = inline_nodes(last.rhs, {e.target: e for e in epilogue_nodes[:-1]})
        column = epilogue_column(model, last)
        assert column is not None
        epilogue = rename_vars(inlined, {column: cv})
        for x in walk(epilogue):
            if isinstance(x, Load) and x.tensor != eq.target and not any(x == ld for ld, _ in epi_loads):
                epi_loads.append((x, access_for(model.tensor(x.tensor), x.indices, axis_of, extent_of_axis, storage)))
    stored = epilogue_nodes[-1].target if epilogue_nodes else eq.target
    # the stored node's index: the column, and row 0 of the size-1 extents an epilogue's node adds around it
    # (`dB[one h] = G[h]`: the bias gradient in its broadcast shape)
    stored_index = out_index if not epilogue_nodes or len(epilogue_nodes[-1].lhs) == 1 else tuple(
        cv if v == epilogue_column(model, epilogue_nodes[-1]) else IndexConst(0) for v in epilogue_nodes[-1].lhs)
    out = access_for(model.tensor(stored), stored_index, axis_of, extent_of_axis, storage)
    sizes = {e.name: e.size for e in model.extents}
    r_size = None if any(sizes[e] is None for e in leading) else row_count(leading, sizes)
    one_split = r_size is not None and -(-r_size // kernel.rows_per_split) <= 1
    # splits add (a Σ) or take the max (a max) atomically into an f32 output; elsewhere they store, and the
    # rules then ask for one split (`row-split-combine`)
    combine = "store" if one_split or out.dtype != "f32" else "atomic" if rhs.op == "sum" else "atomic-max"
    return ColumnLowering(kernel, leading, c_extent, rhs.op, node, tuple(loads), out, combine,
                          kernel.index_width, *column_maps(kernel), epilogue, eq.target, tuple(epi_loads))
