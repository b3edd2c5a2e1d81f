"""`terms:T`: a sum of grouped GEMMs written as one node becomes a node per product.

A derived MoE backward adds each routed row's input gradient through both projections that read it,
gathered back to its token:

    dX[IX[r] d] += (Σ h dTup[r h] · W3[E[r] h d]) + (Σ h2 dTgate[r h2] · W1[E[r] h2 d])

No kernel family takes that node as it stands (the grouped family computes one product; the general
family computes it lane by lane, far from the tensor cores). Rewritten, each product that is a grouped
GEMM is a node of its own, stored in f32 (the accumulator's precision, as `scatter:T` keeps it), and T
adds them with the rest of its terms:

    dX.t0[r d] = Σ h dTup[r h] · W3[E[r] h d]          a grouped GEMM (n-major weights: the wgmma loop)
    dX.t1[r d] = Σ h2 dTgate[r h2] · W1[E[r] h2 d]     another
    dX[IX[r] d] += dX.t0[r d] + dX.t1[r d]              the scatter-add, elementwise (the general family)

The same values up to the f32 rounding of each product and of their sum, which the one-node kernel
rounds in its own order; the rewrite is proven like any other (the finite-field check of the rewritten
plan against the model as written: T.t0 and T.t1 are kernel boundaries the check reads and writes).
Default plans take it where two or more of a node's terms are grouped GEMMs."""

from __future__ import annotations

from dataclasses import replace

from habu.plan.grouped_pattern import as_grouped_gemm
from habu.spec.dtypes import DTYPES
from habu.spec.grad_factor import terms
from habu.spec.ir import Equation, Load, Model, Op, Reduce, TensorDecl, free_vars, walk


def terms_part(model: Model, target: str) -> tuple[Equation, tuple[tuple[int, Equation], ...]] | None:
    """T's node and each of its terms that is a grouped GEMM over T's whole domain, as a node `T.t{i}` (i: the
    term's place in the sum); None unless two or more are."""
    eq = next((e for e in model.nodes if e.target == target), None)
    if eq is None:
        return None
    parts = []
    for i, term in enumerate(terms(eq.rhs)):
        if not any(isinstance(x, Reduce) for x in walk(term)) or free_vars(term) != set(eq.lhs):
            continue
        part = Equation(f"{target}.t{i}", eq.lhs, term)
        if as_grouped_gemm(model, part) is not None:
            parts.append((i, part))
    return (eq, tuple(parts)) if len(parts) >= 2 else None


def apply_terms(model: Model, target: str) -> Model:
    found = terms_part(model, target)
    assert found is not None
    eq, parts = found
    by_place = dict(parts)
    summed = [Load(by_place[i].target, by_place[i].lhs) if i in by_place else t for i, t in enumerate(terms(eq.rhs))]
    rhs = summed[0]
    for t in summed[1:]:
        rhs = Op("add", (rhs, t))
    nodes: list[Equation] = []
    for e in model.nodes:
        nodes += [*(p for _, p in parts), replace(eq, rhs=rhs)] if e is eq else [e]
    decls = tuple(TensorDecl(p.target, tuple(v.extent for v in p.lhs), DTYPES["f32"]) for _, p in parts)
    return replace(model, nodes=tuple(nodes), intermediates=(*model.intermediates, *decls))


__all__ = ["apply_terms", "terms", "terms_part"]
