"""`gather:T`: an operand a contraction gathers on its reduction axis copied out first, as torch computes it.

`dB[n k] = Σ m dO[m n] · A[IX[m] k]` (GGEMM's backward) reads A's rows through IX on the reduction axis m:
the contraction family's default stages them (a pass that gathers and transposes A's rows into a k-major
buffer TMA reads: 48 µs of dB's 214 at 4096³ on the H200). Rewritten, it is two nodes:

    T.g[m k] = A[IX[m] k]                   a gathered copy (the general family's kernel)
    T[n k] = Σ m dO[m n] · T.g[m k]         a plain contraction (both operands m-major: TMA, the
                                            transpose bits of wgmma)

T.g keeps A's element type (a copy rounds nothing). Proven like any rewrite: the finite-field check of the
rewritten plan against the model as written (T.g is a kernel boundary)."""

from __future__ import annotations

from dataclasses import replace

from habu.plan.patterns import as_contraction
from habu.plan.split import replaced
from habu.spec.ir import Equation, IndexVar, Load, Model, TensorDecl


def gather_part(model: Model, target: str) -> tuple[Equation, Load, Equation] | None:
    """T's node, its operand gathered on the reduction axis, and the copy `T.g[m k] = A[IX[m] k]`; None unless
    T is a contraction (no scatter) with such an operand."""
    eq = next((e for e in model.nodes if e.target == target), None)
    c = as_contraction(eq) if eq is not None and eq.scatter is None else None
    if c is None:
        return None
    op = next((o for o in (c.a, c.b) if o.k_gather is not None), None)
    if op is None:
        return None
    variables: list[IndexVar] = []
    for ix in op.load.indices:
        inner = ix if isinstance(ix, IndexVar) else ix.indices[0]  # (an operand's gather is over one variable)
        assert isinstance(inner, IndexVar)
        variables.append(inner)
    return eq, op.load, Equation(f"{target}.g", tuple(variables), op.load)


def apply_gather(model: Model, target: str) -> Model:
    found = gather_part(model, target)
    assert found is not None
    eq, load, copy = found
    new = Load(copy.target, copy.lhs)
    nodes: list[Equation] = []
    for e in model.nodes:
        nodes += [copy, replace(eq, rhs=replaced(eq.rhs, load, new))] if e is eq else [e]
    decl = TensorDecl(copy.target, tuple(v.extent for v in copy.lhs), model.tensor(load.tensor).dtype)
    return replace(model, nodes=tuple(nodes), intermediates=(*model.intermediates, decl))


__all__ = ["apply_gather", "gather_part"]
