"""Column reductions (the column family's node, `T[n] = op rs body(rs, n)`), recognised by
`as_column_reduction`, their reduced axes leading (`[rs n]`) or trailing (`[n rs]`, a transposed one:
`O[b] = Σ i X[b i]`), and when a row statistic of a few long rows is better computed as a transposed
column reduction (its rows split over the grid) than by the row family (one block per row: `tiny_rows`).
Re-exported by habu.plan.patterns, whose region building uses them."""

from __future__ import annotations

from dataclasses import dataclass

from habu.spec.ir import Compare, Equation, Expr, IndexVar, Load, Model, Reduce, walk

# a row statistic of at most this many rows (`O[b] = Σ i X[b i]`, #B static), each of at least
# TINY_ROWS_MIN_COLUMNS columns, into f32, is a column reduction (its rows as the columns, split over the
# grid) rather than a row kernel of one block per row (a few SMs of the GPU busy). H200, 2026-12-02
# (habu.bench.tiny_rows_speed): 4 x 1M f32 54.6 -> 9.7 µs, 1 x 4M bf16 219.0 -> 9.5; but 16 x 256K (the
# row kernel's clusters of 8 blocks: 128 blocks) 9.9 µs as rows, 11.5 as columns: at most 8 rows (64
# blocks at most as clusters, half the GPU)
TINY_ROWS = 8
TINY_ROWS_MIN_COLUMNS = 16384


@dataclass(frozen=True)
class ColumnReduction:
    """`T[n] = op rs body(rs, n)`: one reduction (Σ or max) over the leading axes `rs` of every load that
    reads a row (one axis `r`, or several flattened into rows: `G[n] = Σ b Σ s dY[b s n]`), the output
    indexed by the trailing axis `n`. Each load of the body reads `[rs n]` (a row's column), `[n]` (one
    value per column) or `[rs]` (one value per row), the leading axes in one order: the rows'."""

    node: Equation
    rs: tuple[IndexVar, ...]
    n: IndexVar | None  # None: a scalar output (`da = Σ n dY[n] · x[n]`), a column reduction of one column
    op: str
    # the loads read `[n rs]`: the output's axis leads and the reduced axes trail (`O[b] = Σ i X[b i]`, a
    # row statistic of a few long rows, as columns: each thread a row's element of every column, the
    # rows split over the grid; `transposed_rows` says when the default takes it)
    transposed: bool = False


def _reduced_vars(rhs: Reduce) -> tuple[str, tuple[IndexVar, ...], Expr]:
    """The op, the variables and the body of a reduction, nested sums merged (`Σ b Σ s x` is `Σ b s x`, over GF(p)
    too). Nested maxes are not: the field's max of a set is the product Π (r − x) over its points, so a max of
    maxes is another value than the max over both sets, and a kernel that merged them was refused as computing
    something else (seed 11629 of the random-model fuzz: `max p3 (max p4 X0[p2 p4 p3])`)."""
    op, vs, body = rhs.op, list(rhs.vars), rhs.body
    while isinstance(body, Reduce) and body.op == op == "sum":
        vs.extend(body.vars)
        body = body.body
    return op, tuple(vs), body


def as_column_reduction(eq: Equation) -> ColumnReduction | None:
    """Recognise a column reduction (the column family's node), or None. A node that reads its own
    result (an in-place update) is not one: row splits add into the output while others read it. A
    scalar output (`da = Σ n dT[n] · x[n]`, every load reading the rows `[n]` or a scalar) is a column
    reduction of one column: its rows split over the grid, the splits added atomically, where the
    general family would reduce them all in one thread (a scalar load, `a[]`, is then its column's). A
    scatter-add (`dX[IX[p]] += Σ q …`) is not one: the column family stores each column at its own index."""
    rhs = eq.rhs
    if len(eq.lhs) > 1 or eq.scatter is not None or not isinstance(rhs, Reduce) or rhs.op not in ("sum", "max"):
        return None
    op, vs, body = _reduced_vars(rhs)
    n = eq.lhs[0] if eq.lhs else None
    if n in vs or len(set(vs)) != len(vs) or any(isinstance(x, Reduce | Compare) for x in walk(body)):
        return None  # (a condition on indices: the column family computes none; fuzz masked product 30)
    loads = [x for x in walk(body) if isinstance(x, Load)]
    cols = (n,) if n is not None else ()
    for transposed in (False, True) if cols else (False,):
        rs = row_order(loads, vs, cols, transposed)
        if rs is None:
            continue
        both = (*cols, *rs) if transposed else (*rs, *cols)
        if any(ld.tensor == eq.target or ld.indices not in (both, cols, rs) for ld in loads):
            return None
        node = eq if len(vs) == len(rhs.vars) else Equation(eq.target, eq.lhs, Reduce(op, vs, body), eq.scatter)
        return ColumnReduction(node, rs, n, op, transposed)
    return None


def row_order(loads: list[Load], vs: tuple[IndexVar, ...], cols: tuple[IndexVar, ...], transposed: bool
              ) -> tuple[IndexVar, ...] | None:
    """The reduced axes in the order the first row-column load reads them (`[rs n]`, or `[n rs]`
    transposed), or None where no load reads a row's column."""
    for ld in loads:
        if len(ld.indices) != len(vs) + len(cols):
            continue
        rs, cs = (ld.indices[len(cols):], ld.indices[:len(cols)]) if transposed else \
            (ld.indices[:len(vs)], ld.indices[len(vs):])
        if cs == cols and set(rs) == set(vs):
            return tuple(rs)  # type: ignore[arg-type]
    return None


def tiny_rows(model: Model, eq: Equation, col) -> bool:
    """Whether the transposed column reduction `col` of `eq` has at most TINY_ROWS static rows (its output's
    axis), each at least TINY_ROWS_MIN_COLUMNS long, into an f32 output (the splits add atomically)."""
    if str(model.tensor(eq.target).dtype) != "f32":
        return False
    size = {e.name: e.size for e in model.extents}
    rows, lengths = size.get(col.n.extent), [size.get(v.extent) for v in col.rs]
    if rows is None or any(x is None for x in lengths):
        return False
    long = 1
    for x in lengths:
        long *= x  # type: ignore[operator]
    return rows <= TINY_ROWS and long >= TINY_ROWS_MIN_COLUMNS


__all__ = ["TINY_ROWS", "TINY_ROWS_MIN_COLUMNS", "ColumnReduction", "as_column_reduction", "row_order", "tiny_rows"]
