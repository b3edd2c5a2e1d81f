"""`epilogue:P`: an elementwise node read by one contraction epilogue is computed inside it.

A derived backward recomputes the GELU's input `T2[b h] = S1[b h] + B1[0 h]` from the saved product and
the bias, and its one reader is the GELU derivative `dT2[b h] = dT3[b h] · gelu'(T2[b h])`, which the
contraction `dT3[b h] = Σ d dT6[b d] · W2[h d]` computes in its epilogue. As written, T2 is a kernel of
its own that writes B×H values the epilogue then reads; with T2's right side substituted into dT2, the
epilogue reads S1 and B1 itself and T2 is never written (one kernel, one write and one read fewer).

It applies to a node P (not an output) that reduces nothing, holds no condition and reads no gather,
each of whose loads is indexed by P's own variables or a constant (a broadcast row, `B1[0 h]`), whose
one reader C reads it only at C's own element, where C is the first node of a contraction's epilogue
(`default_regions` of the rewritten model puts C in the contraction's region). The same values: the
rewrite is proven like any other (the finite-field check of the rewritten plan against the model as
written)."""

from __future__ import annotations

from dataclasses import replace

from habu.plan.conditions import has_condition
from habu.plan.patterns import as_contraction, consumers, default_regions, is_elementwise_on
from habu.spec.ir import Equation, Expr, IndexConst, IndexVar, Load, Model, Op, Reduce, rename_vars, walk


def epilogue_part(model: Model, target: str) -> tuple[Equation, Equation] | None:
    """(P's node, its reader C with P substituted) when `epilogue:P` applies, else None."""
    eq = next((e for e in model.nodes if e.target == target), None)
    if eq is None or eq.scatter is not None or target in {t.name for t in model.outputs}:
        return None
    if any(isinstance(x, Reduce) for x in walk(eq.rhs)) or has_condition(eq):
        return None
    own = set(eq.lhs)
    if not all(isinstance(ix, IndexConst) or (isinstance(ix, IndexVar) and ix in own)
               for x in walk(eq.rhs) if isinstance(x, Load) for ix in x.indices):
        return None  # a gather, or an index P does not write: no epilogue access reads it
    readers = consumers(model, target)
    if len(readers) != 1 or readers[0].scatter is not None or not is_elementwise_on(readers[0], eq):
        return None
    reader = readers[0]
    feeding = [p for p in model.nodes if p is not eq and as_contraction(p) is not None
               and consumers(model, p.target) == [reader] and is_elementwise_on(reader, p)]
    if not feeding:
        return None
    inlined = Equation(reader.target, reader.lhs, _substitute(reader.rhs, eq), reader.scatter)
    after = _apply(model, eq, inlined)
    if not any(r.kind == "contraction" and reader.target in r.nodes and r.nodes[0] == feeding[0].target
               for r in default_regions(after)):
        return None
    return eq, inlined


def _substitute(expr: Expr, eq: Equation) -> Expr:
    """`expr` with every load of eq's target replaced by eq's right side at that load's indices."""
    if isinstance(expr, Load):
        return rename_vars(eq.rhs, dict(zip(eq.lhs, expr.indices, strict=True))) if expr.tensor == eq.target else expr
    if isinstance(expr, Op):
        return Op(expr.fn, tuple(_substitute(a, eq) for a in expr.args))
    return expr


def _apply(model: Model, eq: Equation, inlined: Equation) -> Model:
    nodes = tuple(inlined if n.target == inlined.target else n for n in model.nodes if n is not eq)
    return replace(model, nodes=nodes, intermediates=tuple(t for t in model.intermediates if t.name != eq.target))


def apply_epilogue(model: Model, target: str) -> Model:
    found = epilogue_part(model, target)
    assert found is not None
    return _apply(model, *found)


__all__ = ["apply_epilogue", "epilogue_part"]
