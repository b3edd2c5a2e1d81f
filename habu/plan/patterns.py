"""Which kernel family can compute which equation nodes: the analysis plans are built on.

- a *contraction*: `T[m n] = Σ k A[..m..k..] · B[..n..k..]` (rows of A may be gathered), with the
  elementwise nodes that consume only its result fused after it as an epilogue; free indices read
  plainly by both operands and the output are its batch (`S[b i j] = Σ d Q[b i d] · K[b j d]`);
- a *row* region: nodes that work row by row over a 2-D extent pair (r, c), or over the last axis of an
  N-D tensor with its leading axes flattened into rows: elementwise nodes and reductions over c
  (RMSNorm, softmax, layer norm, bias and residual adds);
- a *map* region: elementwise nodes over one shape;
- a *column* region: one reduction over the leading axis (or axes, flattened) of its inputs, one value
  per column (`G[n] = Σ r dY[r n]`, the bias gradient; `Σ b Σ s dY[b s n]`; `max`; elementwise bodies
  such as `Σ r dY[r n] · X[r n]`);
- a *grouped* region: one grouped GEMM `T[r n] = Σ k A[IX[r] k] · W[E[r] n k]` (or `A[r k]`) whose
  weights are chosen per row through a grouping E (`GROUPS:`; habu/lower/grouped.py);
- a *general* region: any other single node (a thread per output element, each reduction a loop),
  and every scatter store (`Y[IX[r] n] += ...`): the fallback, so every equation the language
  accepts has a kernel.

Every node of a model belongs to exactly one region; `default_regions` gives the greedy partition.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations, product
from typing import Any

from habu.errors import HabuError
from habu.plan.column_reduction import ColumnReduction, as_column_reduction, tiny_rows
from habu.plan.conditions import epilogue_conditions, has_condition
from habu.plan.row_reductions import reductions_no_row_runs
from habu.spec.equation import format_expr, format_index
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
    index_subexprs,
    loads,
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
    # index tensor the reduction goes through (`A[IX[m] k]` with m summed: GGEMM's dB), or None; such an
    # operand is read through a staging pass (Move.STAGED) that gathers its rows into a plain buffer
    k_gather: str | None = None


@dataclass(frozen=True)
class Contraction:
    node: Equation
    m: IndexVar
    n: IndexVar
    k: IndexVar
    a: Operand
    b: Operand
    scale: Expr | None  # constant factors of the product, if any
    # free indices both operands and the output read plainly, in the output's order (`b` of
    # S[b i j] = Σ d Q[b i d] · K[b j d]): a grid dimension of the kernel, one product per value
    batch: tuple[IndexVar, ...] = ()

    @property
    def by_default(self) -> bool:
        """Whether the node gets a contraction region (and its fused epilogue): not an operand gathered on
        the reduction axis or a scatter-add store, whose general region's default kernel is the wgmma
        contraction where it builds one (habu.paths.default_contraction; `--pin family=contraction` and the
        search reach the other paths)."""
        return self.node.scatter is None and self.a.k_gather is None and self.b.k_gather is None

    def swapped(self) -> Contraction:
        """The same product with the kernel's roles exchanged (`ContractionKernel.swap_ab`): m is the output's
        column axis, A the factor that carries it, and the tile's rows run along the output's columns."""
        return replace(self, m=self.n, n=self.m, a=self.b, b=self.a)


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
    """A factor of sizes and constants alone (`0.125`, `rsqrt(#E)`): the epilogue multiplies the accumulator by it."""
    return all(isinstance(x, Const | Size | Op) for x in walk(e))


def _operand(ld: Load, axis: IndexVar, k: IndexVar, batch: tuple[IndexVar, ...] = ()) -> Operand | None:
    axis_pos = k_pos = -1
    gather = k_gather = None
    for pos, ix in enumerate(ld.indices):
        if ix in batch:
            if ld.indices.count(ix) != 1:
                return None
        elif ix == k:
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
        elif isinstance(ix, Gather) and ix.indices == (k,):
            if k_pos >= 0:
                return None
            k_pos, k_gather = pos, ix.tensor
        else:
            return None
    if axis_pos < 0 or k_pos < 0 or len(ld.indices) != 2 + sum(1 for v in batch if v in ld.indices):
        return None
    if gather is not None and k_gather is not None:
        return None  # rows and reduction both gathered: no staging pass reads that
    return Operand(ld, axis, axis_pos, k_pos, gather, k_gather)


def as_contraction(eq: Equation) -> Contraction | None:
    """Recognise `T[m n] = Σ k A[m k] · B[n k]` (any index order, A's rows possibly gathered, an operand
    possibly gathered on k: `Σ m dO[m n] · A[IX[m] k]`; a scatter-add `T[IX[m] n] += Σ k …` too, see
    `Contraction.by_default`), and its
    batched form `T[b.. m n] = Σ k A[b.. m k] · B[b.. n k]` (batch indices anywhere, each read plainly
    once by both operands, or by one of them — a weight shared by every batch, `Y[b i n] = Σ d X[b i d] ·
    W[n d]` — and written by the output)."""
    rhs = eq.rhs
    if len(eq.lhs) < 2 or not isinstance(rhs, Reduce) or rhs.op != "sum" or len(rhs.vars) != 1:
        return None
    k = rhs.vars[0]
    factors = _factors(rhs.body)
    loads = [f for f in factors if isinstance(f, Load)]
    consts = [f for f in factors if not isinstance(f, Load)]
    if len(loads) != 2 or not all(_is_constant(c) for c in consts) or len(set(eq.lhs)) != len(eq.lhs):
        return None
    if eq.scatter is not None and (len(eq.lhs) != 2 or not all(
            ix in eq.lhs or (isinstance(ix, Gather) and len(ix.indices) == 1 and ix.indices[0] in eq.lhs)
            for ix in eq.scatter)):
        return None  # a scatter-add epilogue stores at (m or IX[m], n or IX[n]): no other index form
    shared = tuple(v for v in eq.lhs if v in loads[0].indices and v in loads[1].indices)
    one_side = [v for v in eq.lhs if v not in shared]
    extra = len(eq.lhs) - len(shared) - 2  # batch indices read by one operand alone
    if extra < 0:
        return None
    for chosen in combinations(one_side, extra):
        batch = tuple(v for v in eq.lhs if v in shared or v in chosen)
        v0, v1 = [v for v in eq.lhs if v not in batch]
        # m is the output's row axis where either factor order allows it (the product commutes): a
        # tile's rows are then the output's rows and its epilogue stores rows (a TMA store), whichever
        # factor the equation writes first
        for (m, n), (first, second) in product(((v0, v1), (v1, v0)), ((loads[0], loads[1]), (loads[1], loads[0]))):
            a = _operand(first, m, k, batch)
            b = _operand(second, n, k, batch)
            if a and b:
                scale = None
                for c in consts:
                    scale = c if scale is None else Op("mul", (scale, c))
                return Contraction(eq, m, n, k, a, b, scale, batch)
    return None


def kernel_contraction(eq: Equation, kernel: Any) -> Contraction | None:
    """The contraction of `eq` as `kernel` computes it: `as_contraction`, its roles exchanged where the kernel
    swaps them (`swap_ab`)."""
    c = as_contraction(eq)
    return c.swapped() if c is not None and getattr(kernel, "swap_ab", False) else c


def is_elementwise_on(eq: Equation, producer: Equation) -> bool:
    """`eq` reads `producer`'s result only at the element it writes, reduces nothing and holds no
    condition on indices but comparisons of its own coordinates (`epilogue_conditions`: the causal mask)."""
    if any(isinstance(x, Reduce) for x in walk(eq.rhs)) or not epilogue_conditions(eq):
        return False
    if len(eq.lhs) != len(producer.lhs):
        return False
    exts = [v.extent for v in eq.lhs]
    if exts != [v.extent for v in producer.lhs]:
        return False
    for ld in loads(eq.rhs):
        if ld.tensor == producer.target and ld.indices != eq.lhs:
            return False
        for ix in ld.indices:
            if isinstance(ix, Gather):
                return False
    return True


def row_local(eq: Equation) -> tuple[tuple[str, ...], str] | None:
    """(leading extents, column extent) when every access of the node stays in the row it writes: a
    2-D node's rows are its first axis; an N-D node's rows are its leading axes, flattened (`row_axes`).
    A node of fewer axes than its loads is a row statistic (`s[r] = f(Σ c ...)`): its columns are the
    ones it reduces over."""
    two = _row_local_2d(eq)
    if two is not None:
        return (two[0],), two[1]
    axes = row_axes(eq)
    return (tuple(v.extent for v in axes[0]), axes[1]) if axes is not None else None


def _row_local_2d(eq: Equation) -> tuple[str, str] | None:
    """(row extent, column extent) of a node over a 2-D extent pair (r, c), or of a row statistic s[r]."""
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
    reduces = any(isinstance(x, Reduce) for x in walk(eq.rhs))
    if reductions_no_row_runs(eq.rhs, eq.lhs[1] if len(eq.lhs) == 2 else None):
        return None
    for x in walk(eq.rhs):
        if isinstance(x, Reduce) and any(v.extent != c_ext for v in x.vars):
            return None
        if isinstance(x, Load):
            # a reduction over a row read through an index tensor (`Σ d dY[IX[r] d]·T[r d]`: row IX[r] of dY) is
            # the row's (a gathered copy stays a vector copy); any other gather, or 3+ dimensions, is no row's
            first = x.indices[0] if len(x.indices) == 2 else None
            gathered = reduces and isinstance(first, Gather) and first.indices == (r,)
            if any(isinstance(ix, Gather) for ix in (x.indices[1:] if gathered else x.indices)) or len(x.indices) > 2:
                return None
            if x.indices and len(x.indices) == 2 and x.indices[0] not in (r, IndexConst(0)) and not gathered:
                return None
            if len(x.indices) == 1 and x.indices[0] != r and not _is_col_var(x.indices[0], c):
                return None
    return r.extent, c_ext


def row_axes(eq: Equation) -> tuple[tuple[IndexVar, ...], str] | None:
    """The leading index variables (outermost first) and the column extent of an N-D row node, whose
    rows are its leading axes flattened: `Y[b s d] = X[b s d] · rsqrt(Σ d' X[b s d'] ...)` (rows (b, s),
    columns d), or a row statistic `m[b h i] = max j S[b h i j]` (rows (b, h, i), columns j). Each load
    reads leading variables in their order (any of them: `W[s d]`, `g[b]`) and at most one column
    variable, last; every reduction is over the column extent; a statistic reads some tensor's whole rows
    (`S[b h i j]`: a batched product such as `Σ d Q[b i d] · K[b j d]` is no row's). None for anything
    else (2-D nodes are `row_local`'s)."""
    reduced = {v.extent for x in walk(eq.rhs) if isinstance(x, Reduce) for v in x.vars}
    if reductions_no_row_runs(eq.rhs, None):
        return None
    forms = []
    if len(eq.lhs) >= 3 and not reduced - {eq.lhs[-1].extent}:  # a row out: Y[b s d]
        forms.append((eq.lhs[:-1], eq.lhs[-1].extent))
    if len(eq.lhs) >= 2 and len(reduced) == 1 and any(  # a row statistic of a row tensor: m[b h i]
            isinstance(x, Load) and len(x.indices) == len(eq.lhs) + 1 and x.indices[:-1] == eq.lhs
            for x in walk(eq.rhs)):
        forms.append((eq.lhs, next(iter(reduced))))
    for leading, c_ext in forms:
        if len(leading) < len(eq.lhs) and reductions_no_row_runs(eq.rhs, eq.lhs[-1]):
            continue
        if len(set(eq.lhs)) == len(eq.lhs) and all(
                _reads_row(x.indices, leading, c_ext) for x in walk(eq.rhs) if isinstance(x, Load)):
            return tuple(leading), c_ext
    return None


def _reads_row(indices: tuple[IndexExpr, ...], leading: tuple[IndexVar, ...], c_ext: str) -> bool:
    """The load reads leading variables in their order, then at most one column variable."""
    rest = list(indices)
    if rest and isinstance(rest[-1], IndexVar) and rest[-1] not in leading and rest[-1].extent == c_ext:
        rest.pop()
    at = -1
    for ix in rest:
        if not isinstance(ix, IndexVar) or ix not in leading or leading.index(ix) <= at:
            return False
        at = leading.index(ix)
    return True


def _is_col_var(ix: IndexExpr, c: IndexVar) -> bool:
    return isinstance(ix, IndexVar) and ix.extent == c.extent


def consumers(model: Model, target: str) -> list[Equation]:
    return [eq for eq in model.nodes if any(ld.tensor == target for ld in loads(eq.rhs))]


def default_regions(model: Model) -> tuple[Region, ...]:
    """Greedy fusion: a contraction takes the elementwise chain after it; row-local and elementwise
    nodes group with their neighbours of the same shape."""
    from habu.plan.attention_fused import join_statistics  # (they read Region, row_local, consumers)
    from habu.plan.grouped_pattern import as_grouped_gemm  # (it reads _factors)
    from habu.plan.row_fusion import merge_or_add, row_kernel_conditions

    regions: list[Region] = []
    nodes = list(model.nodes)
    i = 0
    while i < len(nodes):
        eq = nodes[i]
        check_gathers(eq)
        c = as_contraction(eq) if eq.scatter is None else None
        # a scatter store and a contraction gathered on its reduction axis: a general region (whose default
        # kernel may be the wgmma contraction: habu.paths.default_contraction); and only the general family
        # computes conditions on indices but a contraction's epilogue and a row reduction (habu/plan/conditions.py)
        if eq.scatter is not None or (c is None and has_condition(eq) and not row_kernel_conditions(model, regions, eq)) \
                or (c is not None and not c.by_default):
            regions.append(general_region(model, eq))
        elif c is not None:
            group = epilogue_chain(model, nodes, i)
            i += len(group) - 1
            regions.append(Region("contraction", group))
        elif (gg := as_grouped_gemm(model, eq)) is not None and gg.by_default:
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
                merge_or_add(regions, Region("rows", (eq.target,)), model)
        elif not eq.lhs:  # a scalar: the map's lanes would all store it
            regions.append(general_region(model, eq))
        elif (fused := column_epilogue(model, regions, eq)) is not None:
            regions[-1] = fused  # computed from each column's reduced value, in the column kernel
        else:
            kind = "rows" if len(eq.lhs) == 2 and row_local(eq) else "map"
            if kind == "map" and any(isinstance(ix, Gather) for x in walk(eq.rhs) if isinstance(x, Load)
                                     for ix in x.indices):
                regions.append(general_region(model, eq))  # the map emitter reads no index tensor
            else:
                merge_or_add(regions, Region(kind, (eq.target,)), model)
        i += 1
    # a row statistic of a few long rows, alone in its region: the column family splits its rows over
    # the grid (the row family would run one block per row)
    # and a softmax-weighted sum's row statistics joined to it (habu/plan/attention_fused.py)
    return join_statistics(model, tuple(Region("columns", r.nodes) if r.kind == "rows" and len(r.nodes) == 1 and
                           transposed_rows(model, next(e for e in nodes if e.target == r.nodes[0])) is not None else r
                           for r in regions))


def epilogue_chain(model: Model, nodes: list[Equation], i: int) -> tuple[str, ...]:
    """The nodes of the contraction region starting at `nodes[i]`: the contraction, then the elementwise
    nodes after it that each read only the one before (its sole reader). A node the model outputs ends the
    chain, unless a later node of the chain is an output too: the region then runs on to the last such
    node and its kernel stores every output of the chain from its epilogue (`ContractionLowering.
    extra_outs`: the forward that saves a LINEAR's product S1 = X·W1 and GELU(S1 + B1) both, one kernel).
    Every output is written once either way; fused, nothing reads S1 back (one pass over it fewer: 117 MB
    of a 4096-token FFN-SKIP's bf16 S1), so the cost model's bytes only drop; the nodes after the last
    output are left to the next region, as an output ends a chain without one."""
    outputs = {t.name for t in model.outputs}
    chain = [nodes[i]]
    while i + len(chain) < len(nodes):
        last, nxt = chain[-1], nodes[i + len(chain)]
        if consumers(model, last.target) != [nxt] or not is_elementwise_on(nxt, last) \
                or nxt.scatter is not None:  # a scatter store is a general region of its own
            break
        chain.append(nxt)
    stored = [j for j, eq in enumerate(chain) if eq.target in outputs]
    if len(stored) < 2:  # at most one output: the chain ends at it (or runs to its end)
        end = stored[0] if stored else len(chain) - 1
    else:
        end = stored[-1]
    return tuple(eq.target for eq in chain[:end + 1])


def transposed_rows(model: Model, eq: Equation) -> ColumnReduction | None:
    """The column reduction a row statistic of a few long rows is (`O[b] = Σ i X[b i]`; `tiny_rows` says
    which), or None."""
    col = as_column_reduction(eq)
    return col if col is not None and col.transposed and col.n is not None and tiny_rows(model, eq, col) else None


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


def column_parts(model: Model, nodes: tuple[str, ...]) -> tuple[Equation, tuple[Equation, ...]]:
    """A column region's reduction node (its scatter kept: a scatter-add is no column reduction), the elementwise
    prologue nodes before it inlined, and its epilogue: the elementwise nodes after it, one value per column."""
    eqs = [next(e for e in model.nodes if e.target == t) for t in nodes]
    at = next((i for i, e in enumerate(eqs) if any(isinstance(x, Reduce) for x in walk(e.rhs))), len(eqs) - 1)
    red, body = eqs[at], inline_nodes(eqs[at].rhs, {e.target: e for e in eqs[:at]})
    return Equation(red.target, red.lhs, body, red.scatter), tuple(eqs[at + 1:])


def column_node(model: Model, nodes: tuple[str, ...]) -> Equation:
    """The reduction node a column region computes, its elementwise prologue nodes inlined."""
    return column_parts(model, nodes)[0]


def column_region(model: Model, nodes: tuple[str, ...]) -> ColumnReduction | None:
    """The region's column reduction when the column family computes the region: the reduction (its
    prologue inlined) is a column reduction, and every epilogue node is elementwise over the columns,
    reading the reduction and the epilogue's earlier nodes at its own column, and other tensors at the
    column (`S[n]`) or as scalars; no epilogue node but the last is read outside the region or output."""
    node, epilogue = column_parts(model, nodes)
    col = as_column_reduction(node)
    if col is None or not epilogue:
        return col
    inside = {node.target}
    outputs = {t.name for t in model.outputs}
    for e in epilogue:
        column = epilogue_column(model, e)
        if column is None or col.n is None or column.extent != col.n.extent or e.scatter is not None:
            return None  # (a scalar's epilogue would broadcast it, not run along its one column)
        for x in walk(e.rhs):
            if isinstance(x, Reduce) or (isinstance(x, Load) and x.indices not in ((), (column,), e.lhs)):
                return None
        for t in inside:  # an inner value read outside the region would need storing
            if t in outputs or any(c.target not in nodes for c in consumers(model, t)):
                return None
        inside.add(e.target)
    return col


def epilogue_column(model: Model, eq: Equation) -> IndexVar | None:
    """The column variable of a column epilogue's node `eq`: its one left-side variable, or the one not over
    a size-1 extent where the others are and its right side never reads them (a bias's gradient stored
    into its broadcast shape, `dB[one h] = G[h]`: the column h at row 0); None for any other left side."""
    wide = [v for v in eq.lhs if model.extent(v.extent).size != 1]
    if len(eq.lhs) == 1:
        return eq.lhs[0]
    if len(wide) != 1:
        return None
    unit = {v for v in eq.lhs if v != wide[0]}
    read = {v for x in walk(eq.rhs) if isinstance(x, Load) for i in x.indices for v in index_subexprs(i)
            if isinstance(v, IndexVar)}
    return None if unit & read else wide[0]


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
    return Region("columns", nodes) if column_region(model, nodes) is not None else None


def column_epilogue(model: Model, regions: list[Region], eq: Equation) -> Region | None:
    """The previous column region with `eq` as (the next node of) its epilogue, when `eq` is elementwise
    over its columns and reads its result (`H[n] = G[n] · 0.5`, a cast `Gb[n] = G[n]`)."""
    if not regions or regions[-1].kind != "columns" or not eq.lhs or any(isinstance(x, Reduce) for x in walk(eq.rhs)):
        return None
    prev = regions[-1]
    if consumers(model, prev.output) != [eq]:
        return None
    nodes = (*prev.nodes, eq.target)
    return Region("columns", nodes) if column_region(model, nodes) is not None else None


def general_region(model: Model, eq: Equation) -> Region:
    """The general family's region of one node, or a `HabuError` naming what no kernel can compute."""
    if any(ld.tensor == eq.target and ld.indices != eq.lhs for ld in loads(eq.rhs)):
        raise HabuError(f"no kernel family computes {eq.target}: it reads its own result at other elements "
                        "than the one it writes")
    return Region("general", (eq.target,))


def check_gathers(eq: Equation) -> None:
    """Every family reads an index tensor at one index variable (`A[IX[m] k]`): a gather through a
    gather, or at a constant, is refused naming the node."""
    for ld in loads(eq.rhs):
        for ix in ld.indices:
            if isinstance(ix, Gather) and (len(ix.indices) != 1 or not isinstance(ix.indices[0], IndexVar)):
                raise HabuError(f"no kernel family computes {eq.target}: the gather {format_index(ix)} (in "
                                f"{format_expr(ld)}) is not indexed by one index variable")


def stored_nodes(model: Model, nodes: tuple[str, ...]) -> tuple[str, ...]:
    """The nodes a kernel computing `nodes` stores, in order: its last, and each earlier one the model
    outputs or a node outside the kernel reads (a row kernel's saved statistic, `R1[r]` of RMSNorm's
    forward with the rstd its backward reads); the others stay on chip."""
    outputs = {t.name for t in model.outputs}
    inside = set(nodes)
    return tuple(t for t in nodes if t == nodes[-1] or t in outputs
                 or any(c.target not in inside for c in consumers(model, t)))
