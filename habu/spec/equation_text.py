"""Printing the IR in the equation language: `format_equation`, `format_expr` (the inverse of the
parser in habu.spec.equation, up to spacing and parentheses)."""

from __future__ import annotations

from fractions import Fraction

from habu.spec.functions import FUNCTIONS
from habu.spec.ir import (
    COMPARISONS,
    MAX_NESTING,
    Compare,
    Const,
    Equation,
    Expr,
    IndexAffine,
    IndexConst,
    IndexExpr,
    IndexVar,
    Load,
    NegInf,
    Op,
    Reduce,
    Size,
    fold_ops,
)

# ----------------------------------------------------------------------------- printing


_PREC = {"add": 1, "sub": 1, "mul": 2, "div": 2, "neg": 3}


def format_index(ix: IndexExpr, depth: int = 0) -> str:
    """`ix` as written; gathers nested deeper than `MAX_NESTING` (only words can build them, and a
    model refuses them) print as `…`."""
    if isinstance(ix, IndexVar):
        return ix.name
    if isinstance(ix, IndexConst):
        return str(ix.value)
    if depth >= MAX_NESTING:
        return "…"
    return f"{ix.tensor}[{' '.join(format_index(i, depth + 1) for i in ix.indices)}]"


def format_const(v: Fraction) -> str:
    if v.denominator == 1:
        return str(v.numerator)
    f = float(v)
    text = repr(f)
    return text


def format_expr(e: Expr, prec: int = 0) -> str:
    """`e` in the equation language, parenthesised where precedence needs it (iterative over
    operator chains: a chain of any length prints)."""
    text, binds = fold_ops(e, _format_leaf, _format_op)
    return f"({text})" if binds < prec else text


_ATOM = 9  # the binding strength of a name, a number or a call: never parenthesised


def _wrap(part: tuple[str, int], prec: int) -> str:
    text, binds = part
    return f"({text})" if binds < prec else text


def format_affine(a: IndexAffine) -> str:
    """`i + #J − #I`, `LEN[b]`, `j + 1`, `0`."""
    parts: list[tuple[int, str]] = [(c, format_index(ix)) for c, ix in a.terms]
    parts += [(c, f"#{e}") for c, e in a.sizes]
    if a.const or not parts:
        parts.append((a.const, ""))
    out = ""
    for k, (c, text) in enumerate(parts):
        mag = abs(c)
        body = text if text and mag == 1 else (f"{mag}·{text}" if text else str(mag))
        if k == 0:
            out = ("−" if c < 0 else "") + body
        else:
            out += (" − " if c < 0 else " + ") + body
    return out


def format_compare(e: Compare) -> str:
    return f"{format_affine(e.left)} {COMPARISONS[e.op]} {format_affine(e.right)}"


def _format_leaf(e: Expr) -> tuple[str, int]:
    """The text of a non-operation and how strongly it binds (0: parenthesised under any operator)."""
    if isinstance(e, Compare):
        return f"[{format_compare(e)}]", _ATOM
    if isinstance(e, NegInf):
        return "−∞", 0
    if isinstance(e, Const):
        return format_const(e.value), (0 if e.value < 0 else _ATOM)
    if isinstance(e, Size):
        return f"#{e.extent}", _ATOM
    if isinstance(e, Load):
        if not e.indices:
            return e.tensor, _ATOM
        return f"{e.tensor}[{' '.join(format_index(i) for i in e.indices)}]", _ATOM
    assert isinstance(e, Reduce)
    sym = "Σ" if e.op == "sum" else "max"
    return f"{sym} {' '.join(v.name for v in e.vars)} {format_expr(e.body, 2)}", 0


def _format_op(e: Op, args: list[tuple[str, int]]) -> tuple[str, int]:
    fn = FUNCTIONS[e.fn]
    if e.fn == "where" and isinstance(e.args[0], Compare):  # the condition without its brackets
        args = [(format_compare(e.args[0]), _ATOM), *args[1:]]
    if fn.infix is None:
        return f"{e.fn}({', '.join(_wrap(a, 0) for a in args)})", _ATOM
    p = _PREC[e.fn]
    if e.fn == "neg":
        return f"−{_wrap(args[0], 3)}", p
    return f"{_wrap(args[0], p)} {fn.infix} {_wrap(args[1], p + 1)}", p


def format_equation(eq: Equation) -> str:
    if eq.scatter is not None:
        return f"{eq.target}[{' '.join(format_index(i) for i in eq.scatter)}] += {format_expr(eq.rhs)}"
    lhs = f"{eq.target}[{' '.join(v.name for v in eq.lhs)}]" if eq.lhs else eq.target
    return f"{lhs} = {format_expr(eq.rhs)}"
