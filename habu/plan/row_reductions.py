"""Reductions a row kernel cannot run (habu/plan/patterns.py's `row_local` and `row_axes` refuse a node that has
one; it takes another kernel, a general one at worst). A row kernel computes each reduction of its node once per
row, along the row's columns, in a pass before the row (habu/lower/rows.py). Found by a fuzz of random models and
their backward (session 45): each was a default plan the finite-field check refused as computing something else.
"""

from __future__ import annotations

from habu.spec.ir import Expr, IndexVar, Reduce, loads, walk


def reductions_no_row_runs(rhs: Expr, column: IndexVar | None) -> bool:
    """Whether `rhs` has a reduction a row kernel cannot run: one reading the output's column variable `column`
    (None: the node has none), one over several variables, or one inside another that reads the outer one's
    variable."""
    return (column is not None and column_inside_reduction(rhs, column)) or several_variables(rhs) or \
        inner_reduction_reads_outer(rhs)


def column_inside_reduction(rhs: Expr, column: IndexVar) -> bool:
    """Whether a reduction's body reads the output's own column variable (`Y[p q] = Σ q2 X[p q]`: the body is
    constant along the reduction and varies with the column). A row kernel reduces along the row's columns, and
    ran that sum over the row instead (Σ q X[p q] where the model has #Q·X[p q]; the field check refused the
    plan; found by a fuzz of random models): such a node is not a row's."""
    return any(isinstance(x, Reduce) and any(column in ld.indices for ld in loads(x.body)) for x in walk(rhs))


def inner_reduction_reads_outer(rhs: Expr) -> bool:
    """Whether a reduction inside another reads the outer one's variable (`Σ p2 dY[p2] · f(max p3 X0[p2] · X1[p3])`,
    a max's backward): a row kernel computes each reduction over the row once, in a pass before the row, and the
    inner one is a value per outer point (the field check found the plan wrong; found by a fuzz)."""
    for outer in walk(rhs):
        if not isinstance(outer, Reduce):
            continue
        for inner in walk(outer.body):
            if isinstance(inner, Reduce) and any(v in ld.indices for ld in loads(inner.body) for v in outer.vars):
                return True
    return False


def several_variables(rhs: Expr) -> bool:
    """Whether a reduction runs over several variables (`dX0[p] = Σ s s2 dY[p s]`, the backward of a sum over an
    unused variable): a row kernel reduces along the row once, and computed Σ s dY[p s], #S times too little (found
    by a fuzz of random models)."""
    return any(isinstance(x, Reduce) and len(x.vars) > 1 for x in walk(rhs))


__all__ = ["column_inside_reduction", "inner_reduction_reads_outer", "reductions_no_row_runs", "several_variables"]
