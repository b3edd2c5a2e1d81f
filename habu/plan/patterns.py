"""Which kernel family can compute which equation nodes: the analysis plans are built on.

- a *contraction*: `T[m n] = Σ k A[..m..k..] · B[..n..k..]` (rows of A may be gathered), with the
  elementwise nodes that consume only its result fused after it as an epilogue;
- a *row* region: nodes that work row by row over a 2-D extent pair (r, c): elementwise nodes and
  reductions over c (RMSNorm, softmax, layer norm, bias and residual adds);
- a *map* region: elementwise nodes over one shape;
- a *column* region: one reduction over the leading axis of its inputs, one value per column
  (`G[n] = Σ r dY[r n]`, the bias gradient; `max`; elementwise bodies such as `Σ r dY[r n] · X[r n]`);
- a *grouped* region: one grouped GEMM `T[r n] = Σ k A[IX[r] k] · W[E[r] n k]` (or `A[r k]`) whose
  weights are chosen per row through a grouping E (`GROUPS:`; habu/lower/grouped.py);
- a *general* region: any other single node (a thread per output element, each reduction a loop),
  and every scatter store (`Y[IX[r] n] += ...`): the fallback, so every equation the language
  accepts has a kernel.

Every node of a model belongs to exactly one region; `default_regions` gives the greedy partition.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations, pairwise

from habu.errors import HabuError
from habu.spec.ir import (
    Const,
    Equation,
    Expr,
    Gather,
    IndexConst,
    IndexExpr,
    IndexVar,
    Load,
    Model,
    Op,
    Reduce,
    Size,
    rename_vars,
    walk,
)


@dataclass(frozen=True)
class Operand:
    """One factor of a contraction: which index position carries the row/col axis and which k."""

    load: Load
    axis_var: IndexVar  # m for A, n for B
    axis_pos: int  # index position that carries the axis (directly or through a gather)
    k_pos: int  # index position that carries k
    gather: str | None  # index tensor the axis goes through (A[IX[m] k]), or None


@dataclass(frozen=True)
class Contraction:
    node: Equation
    m: IndexVar
    n: IndexVar
    k: IndexVar
    a: Operand
    b: Operand
    scale: Expr | None  # constant factors of the product, if any


@dataclass(frozen=True)
class Region:
    """A fusion region: the nodes one kernel computes, in order; `output` is what it stores."""

    kind: str  # "contraction", "rows", "map", "columns", "grouped", "general"
    nodes: tuple[str, ...]  # targets, in model order

    @property
    def output(self) -> str:
        return self.nodes[-1]


def _factors(e: Expr) -> list[Expr]:
    if isinstance(e, Op) and e.fn == "mul":
        return _factors(e.args[0]) + _factors(e.args[1])
    return [e]


def _is_constant(e: Expr) -> bool:
    return all(isinstance(x, Const | Size) or (isinstance(x, Op) and x.fn in ("mul", "div", "add", "sub", "neg"))
               for x in walk(e))


def _operand(ld: Load, axis: IndexVar, k: IndexVar) -> Operand | None:
    axis_pos = k_pos = -1
    gather = None
    for pos, ix in enumerate(ld.indices):
        if ix == k:
            if k_pos >= 0:
                return None
            k_pos = pos
        elif ix == axis:
            if axis_pos >= 0:
                return None
            axis_pos = pos
        elif isinstance(ix, Gather) and ix.indices == (axis,):
            if axis_pos >= 0:
                return None
            axis_pos, gather = pos, ix.tensor
        else:
            return None
    if axis_pos < 0 or k_pos < 0 or len(ld.indices) != 2:
        return None
    return Operand(ld, axis, axis_pos, k_pos, gather)


def as_contraction(eq: Equation) -> Contraction | None:
    """Recognise `T[m n] = Σ k A[m k] · B[n k]` (any index order, A's rows possibly gathered)."""
    rhs = eq.rhs
    if len(eq.lhs) != 2 or not isinstance(rhs, Reduce) or rhs.op != "sum" or len(rhs.vars) != 1:
        return None
    k = rhs.vars[0]
    factors = _factors(rhs.body)
    loads = [f for f in factors if isinstance(f, Load)]
    consts = [f for f in factors if not isinstance(f, Load)]
    if len(loads) != 2 or not all(_is_constant(c) for c in consts):
        return None
    v0, v1 = eq.lhs
    for m, n in ((v0, v1), (v1, v0)):
        a = _operand(loads[0], m, k)
        b = _operand(loads[1], n, k)
        if a and b:
            scale = None
            for c in consts:
                scale = c if scale is None else Op("mul", (scale, c))
            return Contraction(eq, m, n, k, a, b, scale)
    return None


def _reads(e: Expr) -> list[Load]:
    return [x for x in walk(e) if isinstance(x, Load)]


def is_elementwise_on(eq: Equation, producer: Equation) -> bool:
    """`eq` reads `producer`'s result only at the element it writes, and reduces nothing."""
    if any(isinstance(x, Reduce) for x in walk(eq.rhs)):
        return False
    if len(eq.lhs) != len(producer.lhs):
        return False
    exts = [v.extent for v in eq.lhs]
    if exts != [v.extent for v in producer.lhs]:
        return False
    for ld in _reads(eq.rhs):
        if ld.tensor == producer.target and ld.indices != eq.lhs:
            return False
        for ix in ld.indices:
            if isinstance(ix, Gather):
                return False
    return True


def row_local(eq: Equation) -> tuple[str, str] | None:
    """(row extent, column extent) when every access of the node stays in the row it writes. A
    one-dimensional node is a row statistic (`s[r] = f(Σ c ...)`): its columns are the ones it
    reduces over."""
    if len(eq.lhs) == 2:
        r, c_ext = eq.lhs[0], eq.lhs[1].extent
    elif len(eq.lhs) == 1:
        r = eq.lhs[0]
        columns = {v.extent for x in walk(eq.rhs) if isinstance(x, Reduce) for v in x.vars}
        if len(columns) != 1:
            return None
        c_ext = next(iter(columns))
    else:
        return None
    c = IndexVar("c", c_ext)
    for x in walk(eq.rhs):
        if isinstance(x, Reduce) and any(v.extent != c_ext for v in x.vars):
            return None
        if isinstance(x, Load):
            if any(isinstance(ix, Gather) for ix in x.indices) or len(x.indices) > 2:
                return None  # a gather, or a tensor of three or more dimensions, is no row's
            if x.indices and len(x.indices) == 2 and x.indices[0] not in (r, IndexConst(0)):
                return None
            if len(x.indices) == 1 and x.indices[0] != r and not _is_col_var(x.indices[0], c):
                return None
    return r.extent, c_ext


def _is_col_var(ix: IndexExpr, c: IndexVar) -> bool:
    return isinstance(ix, IndexVar) and ix.extent == c.extent


def consumers(model: Model, target: str) -> list[Equation]:
    return [eq for eq in model.nodes if any(ld.tensor == target for ld in _reads(eq.rhs))]


def default_regions(model: Model) -> tuple[Region, ...]:
    """Greedy fusion: a contraction takes the elementwise chain after it; row-local and elementwise
    nodes group with their neighbours of the same shape."""
    outputs = {t.name for t in model.outputs}
    regions: list[Region] = []
    nodes = list(model.nodes)
    i = 0
    while i < len(nodes):
        eq = nodes[i]
        check_gathers(eq)
        c = as_contraction(eq) if eq.scatter is None else None
        if eq.scatter is not None:  # a scatter store: only the general family adds through an index
            regions.append(general_region(model, eq))
        elif c is not None:
            group = [eq.target]
            last = eq
            while i + 1 < len(nodes):
                nxt = nodes[i + 1]
                users = consumers(model, last.target)
                if last.target in outputs or users != [nxt] or not is_elementwise_on(nxt, last):
                    break
                group.append(nxt.target)
                last = nxt
                i += 1
            regions.append(Region("contraction", tuple(group)))
        elif as_grouped_gemm(model, eq) is not None:
            regions.append(Region("grouped", (eq.target,)))
        elif any(isinstance(x, Reduce) for x in walk(eq.rhs)):
            if row_local(eq) is None:
                if as_column_reduction(eq) is None:
                    regions.append(general_region(model, eq))
                elif (fused := column_prologue(model, regions, eq)) is not None:
                    regions[-1] = fused  # the elementwise nodes before it, inlined into its body
                else:
                    regions.append(Region("columns", (eq.target,)))
            else:
                _merge_or_add(regions, Region("rows", (eq.target,)), model)
        elif not eq.lhs:  # a scalar: the map's lanes would all store it
            regions.append(general_region(model, eq))
        else:
            kind = "rows" if len(eq.lhs) == 2 and row_local(eq) else "map"
            _merge_or_add(regions, Region(kind, (eq.target,)), model)
        i += 1
    return tuple(regions)


@dataclass(frozen=True)
class GroupedGemm:
    """`T[r n] = scale · Σ k A[IX[r] k] · W[E[r] n k]`: the rows r of A (gathered through `gather`, or
    not), each row's weights the slab W[E[r]] of its group (E a grouping: rows of a group contiguous)."""

    node: Equation
    r: IndexVar
    n: IndexVar
    k: IndexVar
    a: Load
    w: Load
    groups: str  # the grouping E
    group_extent: str  # the extent of E's values (W's first dimension)
    scale: Expr | None


def as_grouped_gemm(model: Model, eq: Equation) -> GroupedGemm | None:
    """Recognise a grouped GEMM (the grouped family's node), or None."""
    rhs = eq.rhs
    if eq.scatter is not None or len(eq.lhs) != 2 or not isinstance(rhs, Reduce) or rhs.op != "sum" \
            or len(rhs.vars) != 1:
        return None
    (r, n), (k,) = eq.lhs, rhs.vars
    factors = _factors(rhs.body)
    loads = [f for f in factors if isinstance(f, Load)]
    consts = [f for f in factors if not isinstance(f, Load)]
    if len(loads) != 2 or not all(_is_constant(c) for c in consts) or len({r, n, k}) != 3:
        return None
    for a, w in ((loads[0], loads[1]), (loads[1], loads[0])):
        row = a.indices[0] if len(a.indices) == 2 else None
        gathered = isinstance(row, Gather) and row.indices == (r,)
        if a.indices[1:] != (k,) or not (row == r or gathered):
            continue
        if len(w.indices) != 3 or w.indices[1:] != (n, k) or not isinstance(w.indices[0], Gather):
            continue
        g = w.indices[0]
        decl = model.tensor(g.tensor)
        if g.indices != (r,) or not decl.grouped or decl.range is None:
            continue
        if model.tensor(w.tensor).extents[0] != decl.range or a.tensor == eq.target or w.tensor == eq.target:
            continue
        if str(model.tensor(a.tensor).dtype) != "bf16" or str(model.tensor(w.tensor).dtype) != "bf16":
            continue  # mma.sync m16n8k16 on bf16 operands; other types stay with the general family
        scale = None
        for c in consts:
            scale = c if scale is None else Op("mul", (scale, c))
        return GroupedGemm(eq, r, n, k, a, w, g.tensor, decl.range, scale)
    return None


@dataclass(frozen=True)
class ColumnReduction:
    """`T[n] = op r body(r, n)`: one reduction (Σ or max) over the leading axis `r` of every load that
    reads a row, the output indexed by the trailing axis `n`. Each load of the body reads `[r n]` (a
    row's column), `[n]` (one value per column) or `[r]` (one value per row)."""

    node: Equation
    r: IndexVar
    n: IndexVar
    op: str


def as_column_reduction(eq: Equation) -> ColumnReduction | None:
    """Recognise a column reduction (the column family's node), or None. A node that reads its own
    result (an in-place update) is not one: row splits add into the output while others read it."""
    rhs = eq.rhs
    if len(eq.lhs) != 1 or not isinstance(rhs, Reduce) or rhs.op not in ("sum", "max") or len(rhs.vars) != 1:
        return None
    (n,), (r,) = eq.lhs, rhs.vars
    if r == n or any(isinstance(x, Reduce) for x in walk(rhs.body)):
        return None
    full = False
    for ld in _reads(rhs.body):
        if ld.tensor == eq.target or ld.indices not in ((r, n), (n,), (r,)):
            return None
        full = full or ld.indices == (r, n)
    return ColumnReduction(eq, r, n, rhs.op) if full else None


def inline_nodes(expr: Expr, defs: dict[str, Equation]) -> Expr:
    """`expr` with loads of the nodes `defs` replaced by their (elementwise) definitions."""
    if isinstance(expr, Load) and expr.tensor in defs:
        eq = defs[expr.tensor]
        return inline_nodes(rename_vars(eq.rhs, dict(zip(eq.lhs, expr.indices, strict=True))), defs)
    if isinstance(expr, Op):
        return Op(expr.fn, tuple(inline_nodes(a, defs) for a in expr.args))
    if isinstance(expr, Reduce):
        return Reduce(expr.op, expr.vars, inline_nodes(expr.body, defs))
    return expr


def column_node(model: Model, nodes: tuple[str, ...]) -> Equation:
    """The node a column region computes: its last, with the elementwise nodes before it inlined."""
    eqs = [next(e for e in model.nodes if e.target == t) for t in nodes]
    last = eqs[-1]
    return Equation(last.target, last.lhs, inline_nodes(last.rhs, {e.target: e for e in eqs[:-1]}))


def column_prologue(model: Model, regions: list[Region], eq: Equation) -> Region | None:
    """The column region of `eq` with the previous region as its prologue, when that region is
    elementwise (no reduction), stores nothing the model outputs, is read only by `eq`, and `eq` with it
    inlined is still a column reduction (`Z[r n] = dY[r n] · X[r n]` then `G[n] = Σ r Z[r n]`)."""
    if not regions or regions[-1].kind not in ("rows", "map"):
        return None
    prev = regions[-1]
    eqs = [next(e for e in model.nodes if e.target == t) for t in prev.nodes]
    outputs = {t.name for t in model.outputs}
    if any(isinstance(x, Reduce) for e in eqs for x in walk(e.rhs)) or any(e.target in outputs for e in eqs):
        return None
    if consumers(model, prev.output) != [eq]:
        return None
    nodes = (*prev.nodes, eq.target)
    return Region("columns", nodes) if as_column_reduction(column_node(model, nodes)) is not None else None


def general_region(model: Model, eq: Equation) -> Region:
    """The general family's region of one node, or a `HabuError` naming what no kernel can compute."""
    if any(ld.tensor == eq.target and ld.indices != eq.lhs for ld in _reads(eq.rhs)):
        raise HabuError(f"no kernel family computes {eq.target}: it reads its own result at other elements "
                        "than the one it writes")
    return Region("general", (eq.target,))


def check_gathers(eq: Equation) -> None:
    """Every family reads an index tensor at one index variable (`A[IX[m] k]`): a gather through a
    gather, or at a constant, is refused naming the node."""
    for ld in _reads(eq.rhs):
        for ix in ld.indices:
            if isinstance(ix, Gather) and (len(ix.indices) != 1 or not isinstance(ix.indices[0], IndexVar)):
                raise HabuError(f"no kernel family computes {eq.target}: the gather {ix.tensor}[...] is not "
                                "indexed by one index variable")


def _merge_or_add(regions: list[Region], new: Region, model: Model) -> None:
    """Fuse a row/map node into the previous region when they share the shape and the previous
    region's result is read by nothing else."""
    if regions:
        prev = regions[-1]
        prev_eq = next(e for e in model.nodes if e.target == prev.output)
        new_eq = next(e for e in model.nodes if e.target == new.output)
        outputs = {t.name for t in model.outputs}
        same_shape = [v.extent for v in prev_eq.lhs] == [v.extent for v in new_eq.lhs]
        only_reader = consumers(model, prev.output) == [new_eq] and prev.output not in outputs
        if prev.kind in ("rows", "map") and same_shape and only_reader:
            kind = "rows" if "rows" in (prev.kind, new.kind) else "map"
            regions[-1] = Region(kind, prev.nodes + new.nodes)
            return
    regions.append(new)


def _piece_kind(model: Model, nodes: tuple[str, ...]) -> str:
    eqs = [next(e for e in model.nodes if e.target == t) for t in nodes]
    if as_contraction(eqs[0]) is not None:
        return "contraction"
    if any(any(isinstance(x, Reduce) for x in walk(e.rhs)) for e in eqs):
        return "rows"
    return "rows" if all(len(e.lhs) == 2 and row_local(e) for e in eqs) else "map"


def partitions(model: Model, limit: int = 64) -> list[tuple[Region, ...]]:
    """The partitions of the model's nodes into kernels that the families can compute: the greedy
    (most fused) partition first, then every way of cutting its regions at node boundaries, fewest
    cuts first. A cut stores the intermediate in global memory and launches one more kernel; it
    can still pay (a smaller epilogue keeps the contraction's registers free, a long row chain
    split into kernels that each fit in registers). Each partition appears once; at most `limit`."""
    greedy = default_regions(model)
    boundaries = [(ri, j) for ri, r in enumerate(greedy) for j in range(1, len(r.nodes))]
    out: list[tuple[Region, ...]] = []
    seen: set[tuple[Region, ...]] = set()
    for n_cuts in range(len(boundaries) + 1):
        for cuts in combinations(boundaries, n_cuts):
            regions: list[Region] = []
            for ri, r in enumerate(greedy):
                at = [0, *sorted(j for (rj, j) in cuts if rj == ri), len(r.nodes)]
                for lo, hi in pairwise(at):
                    piece = r.nodes[lo:hi]
                    if r.kind == "columns" and piece[-1] == r.output:  # its reduction, with what prologue is left
                        kind = "columns" if as_column_reduction(column_node(model, piece)) else "general"
                    else:
                        kind = r.kind if r.kind in ("general", "grouped") else _piece_kind(model, piece)
                    regions.append(Region(kind, piece))
            p = tuple(regions)
            if p not in seen:
                seen.add(p)
                out.append(p)
            if len(out) >= limit:
                return out
    return out
