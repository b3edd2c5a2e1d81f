"""`inner:T`: a grouped GEMM nested inside a reduction becomes a node of its own.

A derived MoE backward's router-weight gradient contracts the output gradient with the down projection of
each routed row, which the forward never stored (its combine adds it into the tokens' rows):

    dP[r] = Σ d dY[IX[r] d] · (Σ h Sact[r h] · W2[E[r] d h])

As written, each lane of the general family recomputes the inner product for every d: #R·#D·#H
multiply-adds on the FMA pipes, one lane a row. Rewritten, the inner sum is a grouped GEMM over the rows
and d, stored in f32 (the accumulator's precision, as `scatter:T` and `terms:T` keep theirs), and T's
reduction reads it:

    dP.in[r d] = Σ h Sact[r h] · W2[E[r] d h]          a grouped GEMM (the wgmma loop)
    dP[r] = Σ d dY[IX[r] d] · dP.in[r d]                a row reduction, #R·#D

The same values up to the f32 rounding of the inner products, which the one-node kernel rounds in its own
order; the rewrite is proven like any other (the finite-field check of the rewritten plan against the model
as written). Default plans take it wherever the inner sum is a grouped GEMM."""

from __future__ import annotations

from dataclasses import replace

from habu.plan.grouped_pattern import as_grouped_gemm
from habu.plan.split import replaced, with_f32_part
from habu.spec.ir import Equation, Load, Model, Reduce, free_vars, walk


def inner_part(model: Model, target: str) -> tuple[Equation, Reduce, Equation] | None:
    """T's node, the reduction nested in T's reduction, and that reduction as a node `T.in` over its free
    indices (T's and the outer reduction's, in T's then the outer sum's order); None unless it is a grouped
    GEMM."""
    eq = next((e for e in model.nodes if e.target == target), None)
    if eq is None or not isinstance(eq.rhs, Reduce):
        return None
    outer = eq.rhs
    order = (*eq.lhs, *outer.vars)
    for x in walk(outer.body):
        if isinstance(x, Reduce) and free_vars(x) <= set(order) and not free_vars(x) <= set(eq.lhs):
            part = Equation(f"{target}.in", tuple(v for v in order if v in free_vars(x)), x)
            if as_grouped_gemm(model, part) is not None:
                return eq, x, part
    return None


def apply_inner(model: Model, target: str) -> Model:
    found = inner_part(model, target)
    assert found is not None
    eq, inner, part = found
    return with_f32_part(model, eq, part, replace(eq, rhs=replaced(eq.rhs, inner, Load(part.target, part.lhs))))


__all__ = ["apply_inner", "inner_part"]
