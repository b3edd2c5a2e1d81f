"""`split:T`: a contraction written inside a larger expression becomes a node of its own.

`S[b i j] = (Σ d Q[b i d] · K[b j d]) · 0.125 + M[b i j]` is one equation no contraction family takes
as it stands (its right side is not the Σ alone); split, it is `S.mm[b i j] = Σ d Q[b i d] · K[b j d]`
and `S[b i j] = S.mm[b i j] · 0.125 + M[b i j]`, which the contraction family computes with the rest
as its epilogue (S.mm is never written). The same values: the rewrite is proven like any other
(the finite-field check of the rewritten plan against the model as written)."""

from __future__ import annotations

from dataclasses import replace

from habu.plan.patterns import as_contraction
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Equation, Expr, Gather, Load, Model, Op, Reduce, TensorDecl, free_vars, walk


def split_part(model: Model, target: str) -> tuple[Equation, Reduce, Equation] | None:
    """T's node, the contraction inside its expression, and that contraction as a node of its own;
    None when T's right side is a reduction itself, or holds no contraction over T's indices alone."""
    eq = next((e for e in model.nodes if e.target == target), None)
    if eq is None or eq.scatter is not None or isinstance(eq.rhs, Reduce | Load):
        return None
    lhs = set(eq.lhs)
    for x in walk(eq.rhs):
        if isinstance(x, Reduce) and free_vars(x) <= lhs:
            part = Equation(f"{target}.mm", tuple(v for v in eq.lhs if v in free_vars(x)), x)
            rest = replaced(eq.rhs, x, Load(part.target, part.lhs))
            # the rest becomes the contraction's epilogue: one that reads through a gather is not split
            # (the wgmma epilogues print no index check for it)
            c = as_contraction(part)  # (one the default builds: not a gather on its reduction axis)
            if c is not None and c.by_default and not any(
                    isinstance(y, Load) and any(isinstance(i, Gather) for i in y.indices) for y in walk(rest)):
                return eq, x, part
    return None


def replaced(e: Expr, old: Expr, new: Expr) -> Expr:
    """`e` with every occurrence of the subexpression `old` replaced by `new` (inside operators and reductions)."""
    if e == old:
        return new
    if isinstance(e, Op):
        return Op(e.fn, tuple(replaced(a, old, new) for a in e.args))
    if isinstance(e, Reduce):
        return Reduce(e.op, e.vars, replaced(e.body, old, new))
    return e


def apply_split(model: Model, target: str) -> Model:
    found = split_part(model, target)
    assert found is not None
    eq, reduce_, part = found
    load = Load(part.target, part.lhs)
    nodes: list[Equation] = []
    for e in model.nodes:
        if e is eq:
            nodes += [part, replace(eq, rhs=replaced(eq.rhs, reduce_, load))]
        else:
            nodes.append(e)
    decl = TensorDecl(part.target, tuple(v.extent for v in part.lhs), None)
    return replace(model, nodes=tuple(nodes), intermediates=(*model.intermediates, decl))


def with_f32_part(model: Model, eq: Equation, part: Equation, rest: Equation) -> Model:
    """The model with node `eq` replaced by `part`, a new f32 intermediate (the accumulator's precision: `inner:T`,
    `nest:T`, `scatter:T`), and then `rest`, which reads it."""
    nodes: list[Equation] = []
    for e in model.nodes:
        nodes += [part, rest] if e is eq else [e]
    decl = TensorDecl(part.target, tuple(v.extent for v in part.lhs), DTYPES["f32"])
    return replace(model, nodes=tuple(nodes), intermediates=(*model.intermediates, decl))


__all__ = ["apply_split", "replaced", "split_part", "with_f32_part"]
