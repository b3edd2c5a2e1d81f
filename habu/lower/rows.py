"""Lowering row kernels and map kernels.

Row kernel: block b owns rows r = b·R_B + i (i < R_B, masked r < R); each row's columns are visited
in chunks of threads·vector (masked c < C). Reductions over c add only unmasked columns; the
region's nodes are evaluated row by row on chip and only the last is stored.

Map kernel: lane e = (block·threads + t)·vector + v over the output's elements in row-major order,
masked e < numel; each element's coordinates feed every access.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from habu.lower.access import Access, access_for
from habu.search.patterns import row_local
from habu.search.plan import MapKernel, RowKernel
from habu.spec.ir import Equation, Expr, Gather, IndexVar, Load, Model, Op, Reduce, rename_vars, walk

# a thread keeps at most this many 16-byte chunks of its row in registers (all loads in flight at once)
MAX_REGISTER_CHUNKS = 16


def registers_per_thread(threads: int, rows_per_block: int) -> int:
    """What `__launch_bounds__(threads·rows)` leaves each thread of a row kernel (64 K registers per SM)."""
    return min(255, 65536 // (threads * rows_per_block))


def row_registers(chunks: int) -> int:
    """Registers a row kernel's thread needs with `chunks` 16-byte chunks in registers (4 each) and
    about 40 more for addresses, reductions and the epilogue."""
    return 4 * chunks + 40


def register_row_chunks(cols: object, threads: int, vector: int, rows_per_block: int, elem_bytes: int) -> int:
    """The 16-byte chunks of its row each thread keeps in registers, or 0 when the row does not stay in
    registers: the row (static `cols`) splits evenly into at most 16 chunks per thread, and
    `row_registers` fit what the launch bounds leave."""
    if not isinstance(cols, int) or vector * elem_bytes != 16 or cols % (threads * vector):
        return 0
    chunks = cols // (threads * vector)
    fits = 0 < chunks <= MAX_REGISTER_CHUNKS and row_registers(chunks) <= registers_per_thread(threads, rows_per_block)
    return chunks if fits else 0


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


@dataclass(frozen=True)
class RowLowering:
    kernel: RowKernel
    r: str
    c: str
    nodes: tuple[Equation, ...]  # lhs renamed to r, c; reduction variables keep their names
    loads: tuple[tuple[Load, Access], ...]  # reads of tensors the region does not compute
    out: Access
    reduce_mask: bool  # reductions skip columns c >= C (dropped only in planted bugs)
    index_width: int

    @property
    def chunk(self) -> int:
        return self.kernel.threads * self.kernel.vector

    def part(self, sizes: Mapping[str, int]) -> int:
        """Columns each block of a row's cluster owns: block `rank` owns [rank·part, (rank+1)·part)."""
        return -(-sizes[self.c] // self.kernel.cluster)

    def lanes(self, sizes: Mapping[str, int]) -> int:
        """Columns each block's loops visit: whole chunks of threads·vector over the row, the last one
        masked at #C, for a block per row; exactly its part for a block of a cluster (each part is
        whole vectors, and the loops end at it)."""
        part = self.part(sizes)
        return part if self.kernel.cluster > 1 else -(-part // self.chunk) * self.chunk

    def expression(self) -> Expr:
        """The stored value as one expression of the row: the region's earlier nodes inlined."""
        return inline_region(self.nodes[-1].rhs, {eq.target: eq for eq in self.nodes[:-1]})

    @property
    def per_row(self) -> bool:
        """The kernel stores one value per row (a row statistic), not a row."""
        return len(self.nodes[-1].lhs) == 1


@dataclass(frozen=True)
class MapLowering:
    kernel: MapKernel
    extents: tuple[str, ...]  # the output's shape; axis e{i} runs over extents[i]
    nodes: tuple[Equation, ...]
    loads: tuple[tuple[Load, Access], ...]
    out: Access
    index_width: int

    @property
    def per_block(self) -> int:
        return self.kernel.threads * self.kernel.vector


def _region(model: Model, names: tuple[str, ...]) -> list[Equation]:
    return [next(eq for eq in model.nodes if eq.target == t) for t in names]


def lower_rows(model: Model, kernel: RowKernel, storage: Mapping[str, str] | None = None) -> RowLowering:
    nodes = _region(model, kernel.nodes)
    axes = row_local(nodes[-1])
    if axes is None:
        raise ValueError(f"{nodes[-1].target} is not row-local")
    r_ext, c_ext = axes
    rv, cv = IndexVar("r", r_ext), IndexVar("c", c_ext)
    renamed: list[Equation] = []
    for eq in nodes:
        if len(eq.lhs) == 1 and eq is not nodes[-1]:
            raise ValueError(f"a row statistic ({eq.target}) can only end a row kernel")
        mapping: dict[IndexVar, IndexVar] = {eq.lhs[0]: rv}
        if len(eq.lhs) == 2:
            mapping[eq.lhs[1]] = cv
        renamed.append(Equation(eq.target, tuple(mapping.values()), rename_vars(eq.rhs, mapping)))
    defined: set[str] = set()
    loads: list[tuple[Load, Access]] = []
    extent_of_axis = {"r": r_ext, "c": c_ext}
    for eq in renamed:
        for x in walk(eq.rhs):
            if not isinstance(x, Load) or x.tensor in defined or any(x == ld for ld, _ in loads):
                continue
            axis_of = {v: ("r" if v == rv else "c") for v in _vars(x)}
            loads.append((x, access_for(model.tensor(x.tensor), x.indices, axis_of, extent_of_axis, storage)))
        defined.add(eq.target)
    out_vars = renamed[-1].lhs
    out = access_for(model.tensor(renamed[-1].target), out_vars, {v: ("r" if v == rv else "c") for v in out_vars},
                     extent_of_axis, storage)
    return RowLowering(kernel, r_ext, c_ext, tuple(renamed), tuple(loads), out, True, kernel.index_width)


def _vars(ld: Load) -> list[IndexVar]:
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
        mapping = dict(zip(eq.lhs, axes, strict=True))
        renamed.append(Equation(eq.target, tuple(axes), rename_vars(eq.rhs, mapping)))
    defined: set[str] = set()
    extent_of_axis = {f"e{i}": e for i, e in enumerate(extents)}
    loads: list[tuple[Load, Access]] = []
    for eq in renamed:
        for x in walk(eq.rhs):
            if not isinstance(x, Load) or x.tensor in defined or any(x == ld for ld, _ in loads):
                continue
            axis_of = {v: v.name for v in _vars(x)}
            loads.append((x, access_for(model.tensor(x.tensor), x.indices, axis_of, extent_of_axis, storage)))
        defined.add(eq.target)
    out = access_for(model.tensor(last.target), tuple(axes), {v: v.name for v in axes}, extent_of_axis, storage)
    return MapLowering(kernel, extents, tuple(renamed), tuple(loads), out, kernel.index_width)
