"""`nest:T`: a product summed over several variables becomes a batched contraction over one of them, then a sum
over the rest.

Attention's derived backward with grouped queries sums over the query heads of a KV head and the queries:

    dK[b g j e] = Σ r i dS[b g r i j] · Q[b g r i e]

No contraction family takes a reduction over two variables, so the node was a general kernel: one lane an
element, #R·#I multiply-adds each on the FMA pipes (3 ms estimated, 16 query heads over 1024 keys). Rewritten,
the sum over i is a batched contraction whose batch holds r, stored in f32 (the accumulator's precision, as
`inner:T` and `terms:T` keep theirs), and the sum over r reads it:

    dK.in[r b g j e] = Σ i dS[b g r i j] · Q[b g r i e]      a batched contraction (the wgmma loop)
    dK[b g j e] = Σ r dK.in[r b g j e]                       #R reads an element

Of the variables whose contraction forms, the one of the largest extent is contracted (the most work on the
tensor cores; the rest's sum is the smaller). The same values up to the f32 rounding of the partial products;
the rewrite is proven like any other (the finite-field check of the rewritten plan against the model as
written). Default plans take it wherever such a contraction forms."""

from __future__ import annotations

from dataclasses import replace

from habu.plan.patterns import as_contraction
from habu.plan.split import with_f32_part
from habu.spec.ir import Equation, Load, Model, Reduce


def nest_part(model: Model, target: str) -> tuple[Equation, Equation] | None:
    """T's node and the contraction over one of its sum's variables as a node `T.in` over the other variables,
    then T's (in that order); None unless T is a sum over several variables one of which makes a contraction."""
    eq = next((e for e in model.nodes if e.target == target), None)
    if eq is None or eq.scatter is not None or not isinstance(eq.rhs, Reduce) or eq.rhs.op != "sum":
        return None
    outer = eq.rhs
    if len(outer.vars) < 2:
        return None
    best: tuple[int, Equation] | None = None
    for k in outer.vars:
        rest = tuple(v for v in outer.vars if v != k)
        part = Equation(f"{target}.in", (*rest, *eq.lhs), Reduce("sum", (k,), outer.body))
        c = as_contraction(part)
        size = model.extent(k.extent).hi
        if c is not None and c.by_default and (best is None or size > best[0]):
            best = (size, part)
    return None if best is None else (eq, best[1])


def apply_nest(model: Model, target: str) -> Model:
    found = nest_part(model, target)
    assert found is not None
    eq, part = found
    rest = part.lhs[: len(part.lhs) - len(eq.lhs)]
    return with_f32_part(model, eq, part, replace(eq, rhs=Reduce("sum", rest, Load(part.target, part.lhs))))


__all__ = ["apply_nest", "nest_part"]
