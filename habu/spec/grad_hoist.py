"""Hoisting row statistics out of their nodes, before differentiating (`habu.spec.grad`): a reduction
whose value depends on fewer indices than its node becomes a forward value of its own, which the
backward can then save (RMSNorm's per-row rstd, softmax's maximum and sum) or recompute."""

from __future__ import annotations

from dataclasses import replace

from habu.errors import HabuError
from habu.spec.equation import format_expr
from habu.spec.ir import (
    Const,
    Equation,
    Expr,
    IndexVar,
    Load,
    Model,
    Op,
    Reduce,
    Size,
    TensorDecl,
    free_vars,
    rename_vars,
    walk,
)


def _has_reduce(e: Expr) -> bool:
    return any(isinstance(x, Reduce) for x in walk(e))


def _shape_key(e: Expr) -> str:
    """The text of `e` with its bound variables numbered in order: equal for equal computations."""
    names: dict[IndexVar, IndexVar] = {}
    for x in walk(e):
        if isinstance(x, Reduce):
            for v in x.vars:
                names.setdefault(v, IndexVar(f"_b{len(names)}", v.extent))
    return format_expr(rename_vars(e, names))  # type: ignore[arg-type]


def hoist_statistics(model: Model, prefix: str = "%s", keep_row_statistics: bool = False) -> Model:
    """The model with every maximal subexpression that holds a reduction and depends on fewer indices
    than its node made a node of its own (equal ones within a node once): `y[r d] = x[r d] · rsqrt(Σ
    d' x[r d']² / #d + ε)` becomes `%s1[r] = rsqrt(...)`, `y[r d] = x[r d] · %s1[r]`. Same values.
    `keep_row_statistics`: leave those that depend on all but the node's last index (a row kernel
    computes them in place); the others (a column's maximum) are still hoisted. New nodes are named
    `prefix` and a number."""
    nodes: list[Equation] = []
    inter = list(model.intermediates)
    count = [0]

    def hoist(eq: Equation, cache: dict[str, Load]) -> Equation:
        lhs_set = set(eq.lhs)

        def visit(e: Expr, scope: frozenset[IndexVar], root: bool) -> Expr:
            if isinstance(e, Load | Const | Size) or not _has_reduce(e):
                return e
            if not root:
                fv = free_vars(e)
                row = keep_row_statistics and tuple(v for v in eq.lhs if v in fv) == eq.lhs[:-1]
                if fv <= lhs_set and fv != scope and not row:
                    key = _shape_key(e)
                    if key not in cache:
                        vars_ = tuple(v for v in eq.lhs if v in fv)
                        count[0] += 1
                        name = f"{prefix}{count[0]}"
                        nodes.append(hoist(Equation(name, vars_, e), cache))
                        inter.append(TensorDecl(name, tuple(v.extent for v in vars_), None))
                        cache[key] = Load(name, vars_)
                    return cache[key]
            if isinstance(e, Reduce):
                return Reduce(e.op, e.vars, visit(e.body, scope | frozenset(e.vars), False))
            assert isinstance(e, Op)
            return Op(e.fn, tuple(visit(a, scope, False) for a in e.args))

        try:
            return replace(eq, rhs=visit(eq.rhs, frozenset(lhs_set), True))
        except RecursionError:
            raise HabuError(f"cannot differentiate {model.name}: the expression defining {eq.target} nests "
                            "too deeply") from None

    for eq in model.nodes:
        nodes.append(hoist(eq, {}))
    return replace(model, nodes=tuple(nodes), intermediates=tuple(inter))
