"""Repeated indicators in a derived product: `where(c, 1, 0) · … · where(c, 1, 0)` is `where(c, 1, 0)`.

The derivative of `where(c, x, y)` by x is the indicator `where(c, 1, 0)`; attention's forward selects twice by
the one mask (the masked scores inside the exp, the exp's masked weight around it), so the chain rule multiplied
its dS by the same indicator twice. An indicator is exactly 0 or 1 in every domain (float64 and GF(p)), so it is
idempotent (c·c = c) and absorbed by a selection of the same condition that yields 0 elsewhere
(`where(c, x, 0) · where(c, 1, 0) = where(c, x, 0)`): dropping the repeats changes no value."""

from __future__ import annotations

from fractions import Fraction

from habu.spec.grad_factor import factors, product
from habu.spec.ir import Compare, Const, Expr, Op, Reduce


def _indicator(e: Expr) -> Compare | None:
    """c, where e is `where(c, 1, 0)`."""
    if isinstance(e, Op) and e.fn == "where" and isinstance(e.args[0], Compare) and \
            e.args[1] == Const(Fraction(1)) and e.args[2] == Const(Fraction(0)):
        return e.args[0]
    return None


def _selects_zero_else(e: Expr) -> Compare | None:
    """c, where e is `where(c, x, 0)` with x not 1 (a selection that is 0 where c fails)."""
    if isinstance(e, Op) and e.fn == "where" and isinstance(e.args[0], Compare) and \
            e.args[2] == Const(Fraction(0)) and _indicator(e) is None:
        return e.args[0]
    return None


def drop_repeated_indicators(e: Expr) -> Expr:
    """`e` with every product's repeated indicators, and those a selection of the same condition absorbs,
    dropped (see the module's docstring)."""
    if isinstance(e, Reduce):
        return Reduce(e.op, e.vars, drop_repeated_indicators(e.body))
    if not isinstance(e, Op):
        return e
    if e.fn != "mul":
        args = tuple(drop_repeated_indicators(a) for a in e.args)
        return e if args == e.args else Op(e.fn, args)
    fs = [drop_repeated_indicators(f) for f in factors(e)]
    absorbing = {c for f in fs if (c := _selects_zero_else(f)) is not None}
    kept: list[Expr] = []
    seen: set[Compare] = set()
    for f in fs:
        c = _indicator(f)
        if c is not None and (c in seen or c in absorbing):
            continue
        if c is not None:
            seen.add(c)
        kept.append(f)
    return product(kept)


__all__ = ["drop_repeated_indicators"]
