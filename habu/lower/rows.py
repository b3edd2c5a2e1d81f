"""Lowering row kernels and map kernels.

Row kernel: block b owns rows r = b·R_B + i (i < R_B, masked r < R); an N-D node's rows are its leading
axes flattened row-major (R = #B·#S for X[b s d]), and every access reads the leading coordinates of r
through `RowLowering.row_coordinates` (b = r / #S, s = r % #S); each row's columns are visited
in chunks of threads·vector (masked c < C). Reductions over c add only unmasked columns; the
region's nodes are evaluated row by row on chip and the last is stored, a row (or a row's one value); an
earlier row statistic the model outputs or another kernel reads (`stored_nodes`: RMSNorm's saved rstd
R1[r]) is stored too, once a row, by one thread (`StatStore`), once the reductions it reads are combined.

Map kernel: lane e = (block·threads + t)·vector + v over the output's elements in row-major order,
masked e < numel; each element's coordinates feed every access.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from habu.lower.access import Access, FlatGrid, VectorAccess, access_for, cdiv, floordiv
from habu.lower.flatten import FlattenedRows, is_row_axis, row_axis_names
from habu.lower.lanes import ChunkLoop, MapLanes, RowCache, RowThreads
from habu.plan.patterns import row_local, stored_nodes
from habu.plan.plan import MapKernel, RowKernel
from habu.spec.dtypes import DTYPES
from habu.spec.ir import (
    Compare,
    Equation,
    Expr,
    Gather,
    IndexVar,
    Load,
    Model,
    Op,
    Reduce,
    map_ops,
    rename_vars,
    walk,
)

# a thread keeps at most this many 16-byte chunks of its row in registers (all loads in flight at once)
MAX_REGISTER_CHUNKS = 16
# ... or this many when several passes read the row: ptxas then keeps each chunk's converted floats
# live between the passes, twice its packed registers (softmax at 65536 columns, 512 threads with 16
# chunks each: 128 registers and 600 bytes spilled, 793.9 µs on the H200; 1024 threads through shared
# memory 736.0 µs. RMSNorm's one pass spills 72 bytes there and is faster in registers, 2026-12-01)
MAX_REGISTER_CHUNKS_REREAD = 8


def registers_per_thread(threads: int, rows_per_block: int, blocks_per_sm: int = 1) -> int:
    """What `__launch_bounds__(threads·rows, blocks_per_sm)` leaves each thread of a row kernel (64 K registers
    per SM)."""
    return min(255, 65536 // (threads * rows_per_block * blocks_per_sm))


def row_registers(chunks: int) -> int:
    """Registers a row kernel's thread needs with `chunks` 16-byte chunks in registers (4 each) and
    about 40 more for addresses, reductions and the epilogue."""
    return 4 * chunks + 40


def register_row_fit(cols: object, threads: int, vector: int, rows_per_block: int, elem_bytes: int,
                     passes: int = 1, kept: int = 1) -> tuple[int, str]:
    """The 16-byte chunks of its row each thread keeps in registers, and "", or 0 and why the row
    does not stay in registers: the row (static `cols`) splits evenly, the chunks of all `kept` rows
    are at most 16 per thread (8 when `passes` > 1 read them), and `row_registers` fit what the launch
    bounds leave."""
    if not isinstance(cols, int):
        return 0, "the row's width is known only at run time"
    if vector * elem_bytes != 16:
        return 0, f"the row moves in {vector * elem_bytes}-byte vectors, not 16-byte ones"
    if cols % (threads * vector):
        return 0, f"{cols} columns are not whole chunks of {threads} threads × {vector} elements"
    chunks = cols // (threads * vector)
    total = chunks * kept
    most = MAX_REGISTER_CHUNKS if passes <= 1 else MAX_REGISTER_CHUNKS_REREAD
    rows = f" ({chunks} of each of {kept} kept rows)" if kept > 1 else ""
    if total > most:
        reread = " (several passes read the row)" if passes > 1 else ""
        return 0, f"{total} chunks of 16 bytes a thread{rows}, more than {most}{reread}"
    need, have = row_registers(total), registers_per_thread(threads, rows_per_block)
    if need > have:
        return 0, f"{total} chunks a thread{rows} need about {need} registers; {threads} threads have {have} each"
    return chunks, ""


def register_row_chunks(cols: object, threads: int, vector: int, rows_per_block: int, elem_bytes: int,
                        passes: int = 1, kept: int = 1) -> int:
    """The 16-byte chunks of its row each thread keeps in registers, or 0 (`register_row_fit`)."""
    return register_row_fit(cols, threads, vector, rows_per_block, elem_bytes, passes, kept)[0]


# element types a kept row moves in 16-byte vectors of (bf16 and f16 as 8, f32 as 4)
VECTOR_ROW_DTYPES = ("bf16", "f16", "f32")

# functions the SM's special-function units compute, a few per clock (softmax's exp)
SPECIAL_FUNCTIONS = frozenset({"exp", "log", "sqrt", "rsqrt", "tanh", "erf", "sigmoid"})


def _per_column(e: Expr) -> bool:
    """`e` has a value per column: it reads a load outside any reduction (a reduction is a row value)."""
    if isinstance(e, Load):
        return True
    return isinstance(e, Op) and any(_per_column(a) for a in e.args)


def column_functions(expr: Expr) -> int:
    """Special functions applied to each column, in every pass (softmax: exp in its sum and its
    output; RMSNorm and LayerNorm: none, their rsqrt is once per row)."""
    return sum(1 for x in walk(expr) if isinstance(x, Op) and x.fn in SPECIAL_FUNCTIONS and _per_column(x))


def inline_region(expr: Expr, defs: dict[str, Equation]) -> Expr:
    """Replace loads of region-internal tensors by their definitions (they are elementwise in c)."""
    if isinstance(expr, Load) and expr.tensor in defs:
        eq = defs[expr.tensor]
        mapping = dict(zip(eq.lhs, expr.indices, strict=True))
        return inline_region(rename_vars(eq.rhs, mapping), defs)
    if isinstance(expr, Op):
        return Op(expr.fn, tuple(inline_region(a, defs) for a in expr.args))
    if isinstance(expr, Reduce):
        return Reduce(expr.op, expr.vars, inline_region(expr.body, defs))
    return expr


def canonical_reduction(e: Expr, depth: int = 0) -> Expr:
    """`e` with bound variables renamed by nesting depth: reductions equal up to their names compare equal."""
    if isinstance(e, Reduce):
        mapping = {v: IndexVar(f"_b{depth}_{i}", v.extent) for i, v in enumerate(e.vars)}
        return Reduce(e.op, tuple(mapping.values()), canonical_reduction(rename_vars(e.body, mapping), depth + 1))
    if isinstance(e, Op):
        return Op(e.fn, tuple(canonical_reduction(a, depth) for a in e.args))
    return e


def reduction_passes(expr: Expr) -> list[Reduce]:
    """Reductions, innermost first, each once (SOFTMAX's two `max` over n' and n'' are one pass)."""
    out: list[Reduce] = []
    seen: set[Expr] = set()
    for x in reversed(list(walk(expr))):
        if isinstance(x, Reduce) and canonical_reduction(x) not in seen:
            seen.add(canonical_reduction(x))
            out.append(x)
    return out


class RowLoads(dict):
    """The region's loads and their accesses, found by what they read: a load inlined from an
    earlier node of the region (RMSNORM RMSNORM: the second reads the first's x[r d'] under its own
    reduction variable) reads the same access as the load the lowering recorded."""

    def __init__(self, lw: RowLowering) -> None:
        super().__init__((self.key(ld), acc) for ld, acc in lw.loads)

    @staticmethod
    def key(ld: Load) -> tuple:
        # the row variables are `r` (or `r#0`, `r#1`, ... of flattened leading axes); every other index
        # variable walks the row's columns
        return (ld.tensor, tuple((i.name if is_row_axis(i.name) else "c") if isinstance(i, IndexVar) else i
                                 for i in ld.indices))

    def __contains__(self, ld: object) -> bool:
        return isinstance(ld, Load) and super().__contains__(self.key(ld))

    def __getitem__(self, ld: Load) -> Access:
        return super().__getitem__(self.key(ld))


@dataclass(frozen=True)
class PrefetchLayout:
    """The next-row buffer of a prefetching block (16-byte chunks, `uint4`): kept row k's chunk g at
    k·G + g, G the chunks of the block's part of a row (`chunks_per_row`), so the kept rows (dY's and X's
    of a backward) lie one after another. Each thread copies its chunks of every kept row there (cp.async)
    while it computes the current row, and reads back the same slots into registers for the next one;
    `rows_apart` false (planted bugs only) lays every row over the first."""

    rows_apart: bool = True

    def slot(self, k: int, chunk: Any, chunks_per_row: Any) -> Any:
        return chunk if k == 0 or not self.rows_apart else k * chunks_per_row + chunk

    def chunks_per_row(self, lw: RowLowering, sizes: Mapping[str, Any]) -> Any:
        return floordiv(lw.columns(sizes), lw.kernel.vector)


@dataclass(frozen=True)
class StatStore:
    """A row statistic the row kernel stores besides its output (`R1[r]`, the rstd RMSNorm's backward
    reads): its value (the region's earlier nodes inlined; it reads only reductions over the row and
    per-row values), stored at `out` by lane `lane` of the row's threads in cluster block `rank`, after
    every reduction pass. The interpreter stores it from each thread this names (none: a skipped store;
    two: a race), the emitter prints `if (tid == lane ...)`."""

    target: str
    value: Expr
    out: Access
    lane: int = 0
    rank: int = 0

    def stores(self, lane: Any, rank: Any) -> Any:
        """Whether the thread of lane `lane` in cluster block `rank` stores the statistic."""
        return (lane == self.lane) & (rank == self.rank)


@dataclass(frozen=True)
class RowLowering(FlattenedRows):
    kernel: RowKernel
    leading: tuple[str, ...]  # the extents the rows run along, outermost first (one: a 2-D row)
    c: str
    nodes: tuple[Equation, ...]  # lhs renamed to r, c; reduction variables keep their names
    loads: tuple[tuple[Load, Access], ...]  # reads of tensors the region does not compute
    out: Access
    reduce_mask: bool  # reductions skip columns c >= C (dropped only in planted bugs)
    index_width: int
    # warps whose partials a block reduction combines: every warp that has a thread (the emitter
    # prints `lane < combined_warps`; the interpreter drops the columns of any other warp's threads)
    combined_warps: int
    thread_map: RowThreads  # which columns each thread visits (habu/lower/lanes.py)
    cache: RowCache | None  # where the kept row sits in shared memory (None: nothing is kept there)
    # the reductions over the row, one pass each, in the order the kernel runs them (a pass may read
    # only the reductions of earlier passes); pass i keeps its partials in scratch words 33·i ..
    passes: tuple[Reduce, ...]
    # a runtime row width's range lo..hi (None: a static width). Within a factor of two (a size bucket,
    # habu/plan/buckets.py) a row kept in registers is sized for the widest, hi (the chunks past a
    # narrower row's end are masked, as a static row's tail is); over a wider range it is not kept there
    width_range: tuple[int, int] | None = None
    # kept row k (`kept_rows`) is loaded on chip just before pass `loaded_before[k]` runs (len(passes):
    # before the final store), and read from there by every later pass: the first pass that reads it
    loaded_before: tuple[int, ...] = ()
    # with `prefetch`: where the next row's copy puts each kept row's chunks in shared memory
    prefetch_layout: PrefetchLayout | None = None
    # the row statistics stored besides `out`, in node order (RMSNorm's forward saving R1[r] for its backward)
    stats: tuple[StatStore, ...] = ()

    @property
    def chunk(self) -> int:
        return self.kernel.threads * self.kernel.vector


    def coordinates(self, r: Any, col: Any, sizes: Mapping[str, Any]) -> dict[str, Any]:
        """Every axis coordinate of column `col` of row r: `row_coordinates` and `c`."""
        return {**self.row_coordinates(r, sizes), "c": col}

    def columns(self, sizes: Mapping[str, Any]) -> Any:
        """The columns of the row each block visits: its part of a cluster's row, or the whole row."""
        cols = sizes[self.c]
        return floordiv(cols, self.kernel.cluster) if self.kernel.cluster > 1 else cols

    def chunk_loop(self, sizes: Mapping[str, Any]) -> ChunkLoop:
        """The column loop every pass runs at these sizes: a row in registers (`register_chunks`
        16-byte chunks a thread, unrolled), a kept row of 16-byte vectors (chunks while g < G), or
        single columns (while the column is below the part's end)."""
        cols, m = self.columns(sizes), self.thread_map
        regs = self.register_chunks(sizes)
        if regs:
            return ChunkLoop(m, m.vector, regs, floordiv(cols, m.vector))
        if self.vector_row():
            return ChunkLoop(m, m.vector, 0, floordiv(cols, m.vector))
        return ChunkLoop(m, 1, 0, cols)

    def row_cache(self, sizes: Mapping[str, Any]) -> RowCache | None:
        """The shared-memory copy of the kept row at these sizes (None: no copy; a row in registers)."""
        return None if self.register_chunks(sizes) else self.cache

    def part(self, sizes: Mapping[str, int]) -> int:
        """Columns each block of a row's cluster owns: block `rank` owns [rank·part, (rank+1)·part)."""
        return -(-sizes[self.c] // self.kernel.cluster)

    def row_groups(self, sizes: Mapping[str, Any]) -> Any:
        """Groups of `rows_per_block` rows: the interpreter's blocks, each computed on its own."""
        return cdiv(self.rows(sizes), self.kernel.rows_per_block)

    def grid(self, sizes: Mapping[str, int], slots: int) -> int:
        """Blocks launched: a cluster of blocks per row group; with `prefetch`, only the clusters that are
        resident at once (`slots` blocks), cluster j walking groups j, j + G, j + 2G, ... (G clusters
        launched), so every group is computed once, by one cluster, as without it."""
        groups, n = self.row_groups(sizes), self.kernel.cluster
        if self.kernel.prefetch:
            return max(1, min(groups, slots // n)) * n
        return groups * n

    def expression(self) -> Expr:
        """The stored value as one expression of the row: the region's earlier nodes inlined."""
        return self._inlined

    @cached_property
    def _inlined(self) -> Expr:
        return inline_region(self.nodes[-1].rhs, {eq.target: eq for eq in self.nodes[:-1]})

    def kept_row(self) -> Access | None:
        """With `cache_row`: the first kept row (`kept_rows`; every kept row has its element type), or
        None when nothing is kept."""
        return self._kept[0] if self._kept else None

    def kept_rows(self) -> tuple[Access, ...]:
        """With `cache_row`: the rows the passes read again, kept on chip between them, as their loads
        read them: the one tensor read as a whole row (x of softmax, RMSNorm), or, where several are
        (dY and X of RMSNorm's backward), each one a reduction pass reads, when they share one element
        type; () when nothing is kept."""
        return self._kept

    @cached_property
    def _kept(self) -> tuple[Access, ...]:
        expr = self.expression()
        if not self.kernel.cache_row or not reduction_passes(expr):
            return ()
        loads = RowLoads(self)
        row = [*self.row_axes, "c"]  # an N-D row: the leading axes in order, then the column

        def whole_row(acc: Access) -> bool:
            if len(self.leading) == 1:  # X[r c], or a row read through an index tensor, X[IX[r] c]
                return [p.kind for p in acc.positions] in (["axis", "axis"], ["gather", "axis"])
            return [p.kind for p in acc.positions] == ["axis"] * len(row) and [p.axis for p in acc.positions] == row

        def row_loads(e: Expr) -> list[Access]:
            out: list[Access] = []
            for x in walk(e):
                if isinstance(x, Load) and x in loads and whole_row(loads[x]) and loads[x] not in out:
                    out.append(loads[x])
            return out

        rows = row_loads(expr)
        if len({a.tensor for a in rows}) <= 1:
            return tuple(rows[:1])
        reread = [a for a in rows if any(a in row_loads(p.body) for p in reduction_passes(expr))]
        return tuple(reread) if len({a.dtype for a in reread}) == 1 else ()

    def kept_index(self, acc: Access) -> int | None:
        """Which kept row `acc` reads (None: it is read from memory)."""
        kept = self.kept_rows()
        return kept.index(acc) if acc in kept else None

    def vector_row(self) -> bool:
        """The kept row moves in 16-byte vectors of bf16, f16 or f32."""
        acc = self.kept_row()
        return acc is not None and acc.dtype in VECTOR_ROW_DTYPES \
            and self.kernel.vector * DTYPES[acc.dtype].bytes == 16

    def vector_store(self) -> bool:
        """The output row is stored in 16-byte vectors (vector mode, a 16-bit output, a full row)."""
        return self.vector_row() and not self.per_row and self.out.dtype in ("bf16", "f16") \
            and self.kernel.vector * DTYPES[self.out.dtype].bytes == 16

    def stores(self) -> tuple[Access, ...]:
        """Every access the kernel stores through: each statistic's, then the output's."""
        return (*(st.out for st in self.stats), self.out)

    def vector_accesses(self) -> tuple[VectorAccess, ...]:
        """The vector loads and stores of global memory the kernel makes: the kept row's 16-byte
        chunks (loads, and the next row's cp.async copies) and, with them, the output's 16-byte
        stores. The launch checks each tensor's base alignment from this list."""
        out: list[VectorAccess] = []
        for kept in self.kept_rows() if self.vector_row() else ():
            out.append(VectorAccess(kept.tensor, self.kernel.vector,
                                    f"the plan reads {kept.tensor}'s rows in 16-byte vectors"))
        if self.vector_store():
            out.append(VectorAccess(self.out.tensor, self.kernel.vector,
                                    f"the plan stores {self.out.tensor}'s rows in 16-byte vectors"))
        return tuple(out)

    def register_chunks(self, sizes: Mapping[str, object]) -> int:
        """16-byte chunks of the kept row each thread holds in registers (0: the row is not in
        registers): a static part of a row that splits evenly and fits (`register_row_fit`)."""
        return self.register_fit(sizes)[0]

    def register_fit(self, sizes: Mapping[str, object]) -> tuple[int, str]:
        """`register_chunks`, and why the row is not in registers when it is not."""
        acc = self.kept_row()
        if acc is None:
            return 0, "no row is kept on chip (cache_row is off, or no pass reduces the row)"
        if acc.dtype not in VECTOR_ROW_DTYPES:
            return 0, f"the row is {acc.dtype}"
        cols: object = sizes[self.c]
        if self.width_range is not None:
            # one answer at every size of the range (the proof's witness, the emitter's runtime width,
            # the default's widest): a bucket's widest row in whole chunks of the block, or none
            lo, hi = self.width_range
            if lo == hi:  # one size (a plan's shape gives it): as a static width
                cols = hi
            elif 2 * lo <= hi or self.kernel.cluster != 1:
                return 0, f"the row's width is known only at run time ({lo}..{hi}, more than a factor of two)"
            else:
                chunk = self.kernel.threads * self.kernel.vector
                cols = -(-hi // chunk) * chunk
        part = cols // self.kernel.cluster if isinstance(cols, int) else cols
        return register_row_fit(part, self.kernel.threads, self.kernel.vector, self.kernel.rows_per_block,
                                DTYPES[acc.dtype].bytes, len(reduction_passes(self.expression())),
                                len(self.kept_rows()))

    def one_block_per_sm(self, sizes: Mapping[str, object]) -> bool:
        """A block keeping its row in registers takes more than half of an SM's registers (64 K): no
        second block shares the SM to load while this one computes."""
        chunks = self.register_chunks(sizes) * len(self.kept_rows())
        return chunks > 0 and self.kernel.threads * self.kernel.rows_per_block * row_registers(chunks) > 32768

    @property
    def per_row(self) -> bool:
        """The kernel stores one value per row (a row statistic), not a row."""
        return len(self.nodes[-1].lhs) == len(self.leading)


@dataclass(frozen=True)
class MapLowering(FlatGrid):
    kernel: MapKernel
    extents: tuple[str, ...]  # the output's shape; axis e{i} runs over extents[i]
    nodes: tuple[Equation, ...]
    loads: tuple[tuple[Load, Access], ...]
    out: Access
    index_width: int
    lanes: MapLanes  # which elements each thread computes (habu/lower/lanes.py)

    @property
    def per_block(self) -> int:
        return self.kernel.threads * self.kernel.vector

    def vector_accesses(self) -> tuple[VectorAccess, ...]:
        """None: a lane reads and writes its `vector` consecutive elements one by one."""
        return ()


def _region(model: Model, names: tuple[str, ...]) -> list[Equation]:
    return [next(eq for eq in model.nodes if eq.target == t) for t in names]


def lower_rows(model: Model, kernel: RowKernel, storage: Mapping[str, str] | None = None) -> RowLowering:
    nodes = _region(model, kernel.nodes)
    axes = row_local(nodes[-1])
    if axes is None:
        raise ValueError(f"{nodes[-1].target} is not row-local")
    leading, c_ext = axes
    names = row_axis_names(len(leading))
    rvs = tuple(IndexVar(n, e) for n, e in zip(names, leading, strict=True))
    cv = IndexVar("c", c_ext)
    renamed: list[Equation] = []
    stored = stored_nodes(model, kernel.nodes)
    for eq in nodes:
        if eq.target in stored and eq is not nodes[-1] and len(eq.lhs) != len(leading):
            raise ValueError(f"a row kernel stores a row only as its last node; {eq.target} is read outside it")
        if len(eq.lhs) not in (len(leading), len(leading) + 1):
            raise ValueError(f"{eq.target} is not over the rows of {nodes[-1].target}")
        mapping: dict[IndexVar, IndexVar] = dict(zip(eq.lhs, rvs, strict=False))
        if len(eq.lhs) == len(leading) + 1:
            mapping[eq.lhs[-1]] = cv
        rhs = conditions_on_columns(rename_vars(eq.rhs, mapping), set(rvs), cv)
        renamed.append(Equation(eq.target, tuple(mapping.values()), rhs))
    defined: set[str] = set()
    loads: list[tuple[Load, Access]] = []
    extent_of_axis = {**dict(zip(names, leading, strict=True)), "c": c_ext}
    for eq in renamed:
        for x in walk(eq.rhs):
            if not isinstance(x, Load) or x.tensor in defined or any(x == ld for ld, _ in loads):
                continue
            axis_of = {v: (v.name if v in rvs else "c") for v in load_index_vars(x)}
            loads.append((x, access_for(model.tensor(x.tensor), x.indices, axis_of, extent_of_axis, storage)))
        defined.add(eq.target)
    out_vars = renamed[-1].lhs
    out = access_for(model.tensor(renamed[-1].target), out_vars, {v: (v.name if v in rvs else "c") for v in out_vars},
                     extent_of_axis, storage)
    defs = {eq.target: eq for eq in renamed}
    stats = tuple(StatStore(eq.target, inline_region(eq.rhs, {t: d for t, d in defs.items() if t != eq.target}),
                            access_for(model.tensor(eq.target), rvs, {v: v.name for v in rvs}, extent_of_axis, storage))
                  for eq in renamed[:-1] if eq.target in stored)
    lw = RowLowering(kernel, leading, c_ext, tuple(renamed), tuple(loads), out, True, kernel.index_width,
                     -(-kernel.threads // 32),
                     RowThreads(kernel.threads, kernel.rows_per_block, kernel.vector, kernel.threads), None, (),
                     stats=stats)
    passes = tuple(canonical_reduction(p) for p in reduction_passes(lw.expression()))
    for st in stats:  # a statistic is stored after the passes: it reads only reductions the output reads
        if any(canonical_reduction(p) not in passes for p in reduction_passes(st.value)):
            raise ValueError(f"{st.target} reduces the row in a way {out.tensor} does not read")
    width = model.extent(c_ext)
    span = None if width.is_static else (width.lo, width.hi)
    return with_kept_rows(replace(lw, passes=passes, width_range=span))


def conditions_on_columns(e: Expr, rows: set[IndexVar], column: IndexVar) -> Expr:
    """`e` with each condition on indices over the kernel's axes: its row variables are the row axes already, and
    any other variable is the column `c` (a reduction's bound variable, as the loads read it: `axis_of`). The
    finite-field check evaluates the condition at each element's coordinates and the emitter prints it there."""
    def leaf(x: Expr) -> Expr:
        if isinstance(x, Compare):
            return x.map_indices(lambda ix: ix if not isinstance(ix, IndexVar) or ix in rows else column)
        if isinstance(x, Reduce):
            return Reduce(x.op, x.vars, conditions_on_columns(x.body, rows, column))
        return x

    return map_ops(e, leaf)


def with_kept_rows(lw: RowLowering) -> RowLowering:
    """`lw` with what its kept rows decide: their cache on chip, a prefetching block's next-row layout, and the
    pass before which each is loaded (after its loads are lowered, or replaced)."""
    kept = lw.kept_rows()
    cache = RowCache(permuted=lw.vector_row(), rows=len(kept)) if kept else None
    lw = replace(lw, cache=cache, prefetch_layout=PrefetchLayout() if lw.kernel.prefetch and kept else None)
    return replace(lw, loaded_before=tuple(_first_pass_reading(lw, acc) for acc in kept))


def _first_pass_reading(lw: RowLowering, acc: Access) -> int:
    """The first of `lw`'s passes whose body reads the row `acc` (len(passes): only the final store does)."""
    loads = RowLoads(lw)
    for i, p in enumerate(lw.passes):
        if any(isinstance(x, Load) and x in loads and loads[x] == acc for x in walk(p.body)):
            return i
    return len(lw.passes)


def load_index_vars(ld: Load) -> list[IndexVar]:
    """The index variables a load reads, in order, those inside its gathers included."""
    out: list[IndexVar] = []
    for i in ld.indices:
        if isinstance(i, IndexVar):
            out.append(i)
        elif isinstance(i, Gather):
            out.extend(j for j in i.indices if isinstance(j, IndexVar))
    return out


def lower_map(model: Model, kernel: MapKernel, storage: Mapping[str, str] | None = None) -> MapLowering:
    nodes = _region(model, kernel.nodes)
    last = nodes[-1]
    extents = tuple(v.extent for v in last.lhs)
    axes = [IndexVar(f"e{i}", e) for i, e in enumerate(extents)]
    renamed: list[Equation] = []
    for eq in nodes:
        if tuple(v.extent for v in eq.lhs) != extents:
            raise ValueError(f"map kernel nodes must share one shape; {eq.target} differs")
        if eq.scatter is not None or any(isinstance(x, Reduce) for x in walk(eq.rhs)):
            raise ValueError(f"{eq.target} is not elementwise (a reduction or a scatter-add): the map family computes "
                             "one element a lane")
        mapping = dict(zip(eq.lhs, axes, strict=True))
        renamed.append(Equation(eq.target, tuple(axes), rename_vars(eq.rhs, mapping)))
    defined: set[str] = set()
    extent_of_axis = {f"e{i}": e for i, e in enumerate(extents)}
    loads: list[tuple[Load, Access]] = []
    for eq in renamed:
        for x in walk(eq.rhs):
            if not isinstance(x, Load) or x.tensor in defined or any(x == ld for ld, _ in loads):
                continue
            axis_of = {v: v.name for v in load_index_vars(x)}
            loads.append((x, access_for(model.tensor(x.tensor), x.indices, axis_of, extent_of_axis, storage)))
        defined.add(eq.target)
    out = access_for(model.tensor(last.target), tuple(axes), {v: v.name for v in axes}, extent_of_axis, storage)
    return MapLowering(kernel, extents, tuple(renamed), tuple(loads), out, kernel.index_width,
                       MapLanes(kernel.threads, kernel.vector, kernel.vector))
