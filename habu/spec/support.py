"""Where a model's tensors can be nonzero: each node's *support*, conditions on its indices outside which every
element is exactly zero.

Attention's backward writes P = `div0(where(j ≤ i + #J − #I, exp(…), 0), R2)` and dS = `P·s·dP − P·D·s`: both
are zero above the causal diagonal, and dQ = `Σ j dS·K` sums zeros over half its k. A product whose operand is
zero outside a condition that bounds k by the tile's row (habu/lower/k_bounds.py) skips those k tiles; one whose
every output element is zero skips its k loop.

`supports(model)` gives each node's support as a conjunction of `Compare`s over its positions (`position(p)`,
the p-th index of its left side). The rules, each exact in every domain the model is evaluated in (float64,
GF(p)) wherever the factors it drops are finite:
- `where(c, x, 0)` is zero outside c and wherever x is; a comparison as a value, outside itself;
- a product is zero wherever one factor is (the union of the factors' conditions);
- `div0(a, b)` is zero wherever a is (div0(0, b) = 0, b = 0 included);
- `−a` where a is; a sum or difference only where both are (the conditions they share);
- a sum over bound variables wherever its body is, by the conditions that do not read them;
- a load of a node with a support, at plain index variables, by that node's conditions at those variables.
Anything else (exp, max, a gather's read) gives no condition. A float Inf or NaN in a factor a kept condition
multiplies by zero is dropped with it: the kernels that skip such terms compute the masked sum, as
FlashAttention does (docs/VERIFY.md)."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from habu.spec.ir import Compare, Const, Equation, Expr, IndexVar, Load, Model, Op, Reduce

POSITION = "%pos"
ZERO = None  # the support of an expression that is zero everywhere (the constant 0)
Support = frozenset[Compare] | None


def position(p: int, extent: str) -> IndexVar:
    """The index variable standing for a tensor's p-th index in its support's conditions."""
    return IndexVar(f"{POSITION}{p}", extent)


def _variables(c: Compare) -> set[IndexVar]:
    return {ix for ix in c.index_exprs() if isinstance(ix, IndexVar)}


def _plain(c: Compare) -> bool:
    """A condition over index variables, sizes and constants only (no gathered index)."""
    return all(isinstance(ix, IndexVar) for ix in c.index_exprs())


def _union(a: Support, b: Support) -> Support:
    return ZERO if a is ZERO or b is ZERO else a | b


def _shared(a: Support, b: Support) -> Support:
    if a is ZERO:
        return b
    if b is ZERO:
        return a
    return a & b


def _is_zero(e: Expr) -> bool:
    return isinstance(e, Const) and e.value == Fraction(0)


def expression_support(expr: Expr, nodes: Mapping[str, frozenset[Compare]]) -> Support:
    """The conditions outside which `expr` is zero (a conjunction over its free variables), given the nodes'
    supports over their positions; ZERO where it is the constant 0."""
    if _is_zero(expr):
        return ZERO
    if isinstance(expr, Compare):
        return frozenset({expr}) if _plain(expr) else frozenset()
    if isinstance(expr, Load):
        conds = nodes.get(expr.tensor)
        if not conds or not all(isinstance(ix, IndexVar) for ix in expr.indices):
            return frozenset()
        at = {position(p, ix.extent): ix for p, ix in enumerate(expr.indices)}  # type: ignore[union-attr]
        return frozenset(c.map_indices(lambda ix: at.get(ix, ix)) for c in conds)
    if isinstance(expr, Reduce):
        if expr.op != "sum":
            return frozenset()
        body = expression_support(expr.body, nodes)
        bound = set(expr.vars)
        return ZERO if body is ZERO else frozenset(c for c in body if not (_variables(c) & bound))
    if not isinstance(expr, Op):
        return frozenset()
    args = [expression_support(a, nodes) for a in expr.args]
    if expr.fn == "where" and len(args) == 3 and _is_zero(expr.args[2]):
        cond = expr.args[0]
        own = frozenset({cond}) if isinstance(cond, Compare) and _plain(cond) else frozenset()
        return _union(own, args[1])
    if expr.fn == "mul":
        out: Support = frozenset()
        for a in args:
            out = _union(out, a)
        return out
    if expr.fn in ("div0", "neg"):
        return args[0]
    if expr.fn in ("add", "sub"):
        return _shared(args[0], args[1])
    return frozenset()


def _node_support(eq: Equation, nodes: Mapping[str, frozenset[Compare]]) -> frozenset[Compare]:
    """A node's support over its positions: the conditions of its right side that read only its left side's
    variables (renamed to positions)."""
    if eq.scatter is not None:  # a scatter adds into the target's prior contents: no support
        return frozenset()
    found = expression_support(eq.rhs, nodes)
    if found is ZERO:
        return frozenset()  # (a node that is zero everywhere: left to the kernels as it is)
    at = {v: position(p, v.extent) for p, v in enumerate(eq.lhs)}
    return frozenset(c.map_indices(lambda ix: at.get(ix, ix)) for c in found if _variables(c) <= set(at))


def supports(model: Model) -> dict[str, frozenset[Compare]]:
    """Each node's support (only those with at least one condition), in the model's order; an input's is
    unknown (none)."""
    out: dict[str, frozenset[Compare]] = {}
    for eq in model.nodes:
        found = _node_support(eq, out)
        if found:
            out[eq.target] = found
    return out


def conditions_at(conds: frozenset[Compare], indices: tuple[IndexVar, ...]) -> tuple[Compare, ...]:
    """A support's conditions with its positions replaced by `indices` (one variable a position)."""
    at = {position(p, ix.extent): ix for p, ix in enumerate(indices)}
    return tuple(sorted((c.map_indices(lambda ix: at.get(ix, ix)) for c in conds), key=repr))


__all__ = ["POSITION", "conditions_at", "expression_support", "position", "supports"]

