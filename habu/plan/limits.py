"""What the backend can build at all, checked before a plan is made: the spec accepts equations whose
operations nest thousands deep (`habu check`, `habu eval`), but the lowering, the finite-field
interpreter and the C printer walk an equation's tree recursively, and NVRTC compiles the expression
as one C expression. An equation nested deeper than `MAX_NESTING` is refused with the node's name
and how to split it, instead of a RecursionError deep inside the compiler."""

from __future__ import annotations

from habu.errors import HabuError, Span
from habu.spec.ir import Expr, Load, Model, Op, Reduce

MAX_NESTING = 200  # operations from an equation's root to its deepest leaf


def nesting(expr: Expr) -> int:
    """The depth of an expression tree (iterative: trees of any depth)."""
    deepest = 0
    stack: list[tuple[Expr, int]] = [(expr, 1)]
    while stack:
        e, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(e, Op):
            stack.extend((a, d + 1) for a in e.args)
        elif isinstance(e, Reduce):
            stack.append((e.body, d + 1))
        elif not isinstance(e, Load):
            continue
    return deepest


def check_nesting(model: Model, span: Span | None = None) -> None:
    """Refuse a model one of whose equations nests deeper than the backend builds."""
    for eq in model.nodes:
        n = nesting(eq.rhs)
        if n > MAX_NESTING:
            raise HabuError(f"{model.name}: the equation of {eq.target} nests {n} operations deep; the compiler "
                            f"builds at most {MAX_NESTING} (habu check and habu eval take it)", span,
                            ("split it into several equations through intermediate tensors, or write a long "
                             "sum as a Σ over an extent",))


__all__ = ["MAX_NESTING", "check_nesting", "nesting"]
