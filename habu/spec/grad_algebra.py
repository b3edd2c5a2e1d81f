"""Expression algebra the backward derivation builds with (habu.spec.grad): products and sums that
fold constants, fresh index variables, and substitution that renames bound variables."""

from __future__ import annotations

from fractions import Fraction

from habu.spec.ir import Compare, Const, Expr, Gather, IndexExpr, IndexVar, Load, Op, Reduce, map_ops

ZERO = Const(Fraction(0))
ONE = Const(Fraction(1))


def is_const(e: Expr, value: int) -> bool:
    return isinstance(e, Const) and e.value == value


def mul(a: Expr, b: Expr) -> Expr:
    """a · b, with the products by 0, 1 and −1 and of two constants folded."""
    if is_const(a, 0) or is_const(b, 0):
        return ZERO
    if is_const(a, 1):
        return b
    if is_const(b, 1):
        return a
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.value * b.value)
    if is_const(b, -1):
        return Op("neg", (a,))
    return Op("mul", (a, b))


def add_all(terms: list[Expr]) -> Expr:
    """The sum of `terms`, a term that appears k times once times k (x·x's two equal paths)."""
    counts: dict[Expr, int] = {}
    for t in terms:
        counts[t] = counts.get(t, 0) + 1
    out: Expr | None = None
    for t, k in counts.items():
        term = t if k == 1 else mul(Const(Fraction(k)), t)
        out = term if out is None else Op("add", (out, term))
    return out if out is not None else ZERO


class Fresh:
    """Index variables with names no model uses (`_g1`, …); `rename_equation` names them for printing."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, extent: str) -> IndexVar:
        self.n += 1
        return IndexVar(f"{extent.lower()}_g{self.n}", extent)


def substitute(e: Expr, mapping: dict[IndexVar, IndexExpr], fresh: Fresh) -> Expr:
    """`e` with its free index variables replaced and every reduction's bound variables renamed to
    fresh ones (so that no binding captures or shadows a variable of the context it moves into)."""

    def ix(i: IndexExpr, env: dict[IndexVar, IndexExpr]) -> IndexExpr:
        if isinstance(i, IndexVar):
            return env.get(i, i)
        if isinstance(i, Gather):
            return Gather(i.tensor, tuple(ix(j, env) for j in i.indices))
        return i

    def go(x: Expr, env: dict[IndexVar, IndexExpr]) -> Expr:
        def leaf(y: Expr) -> Expr:
            if isinstance(y, Load):
                return Load(y.tensor, tuple(ix(i, env) for i in y.indices))
            if isinstance(y, Reduce):
                bound = tuple(fresh(v.extent) for v in y.vars)
                inner = dict(env) | dict(zip(y.vars, bound, strict=True))
                return Reduce(y.op, bound, go(y.body, inner))
            if isinstance(y, Compare):
                return y.map_indices(lambda i: ix(i, env))
            return y

        return map_ops(x, leaf)

    return go(e, dict(mapping))


__all__ = ["ONE", "ZERO", "Fresh", "add_all", "mul", "substitute"]
