"""`fused:T`: the unfused attention nodes of a softmax-weighted sum T back into one sum, beside the row statistics
the model keeps (a training forward: the maximum and the sum its derived backward reads).

The forward with saved statistics that habu.spec.grad derives for attention (`Backward.forward`) is the unfused
plan's nodes, as `attention:T` (habu/plan/attention_split.py) writes them:

    S[.. j] = where(c, s, −∞)                          the masked scores
    M[..]   = max j S[.. j]                            the row maximum (saved)
    L[..]   = Σ j where(c, exp(S[.. j] − M), 0)         the row sum (saved)
    P[.. j] = div0(where(c, exp(S[.. j] − M), 0), L)   the weights
    T[.. d] = Σ j P[.. j] · V[.. j d]                   the output

With S and P intermediates that only this chain reads, `fused:T` rewrites them as

    M[..]   = max j where(c, s, −∞)
    L[..]   = Σ j where(c, exp(where(c, s, −∞) − M), 0)
    T[.. d] = Σ j softmax_j(where(c, s, −∞)) · V[.. j d]

(S and P inlined: the same values), so that the fused attention kernel computes T and stores M and L from the
running maximum and sum its online softmax ends with (`attention_statistics`: the nodes M and L are T's
softmax's). Without a mask the weights divide by L with `div` and S is s. The rewrite is applied only under
`--pin family=attention` and where the default takes the fused kernel (habu.paths.attention); like every rewrite
it is proven by the finite-field check of the plan against the model as written.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import permutations

from habu.plan.online_softmax import match_softmax_sum
from habu.plan.patterns import Region, consumers, inline_nodes
from habu.spec.conditions import softmax_along
from habu.spec.ir import Const, Equation, Expr, IndexVar, Load, Model, NegInf, Op, Reduce, rename_vars


@dataclass(frozen=True)
class AttentionChain:
    """The unfused nodes of a softmax-weighted sum (names as in the module's text)."""

    scores: Equation  # S
    maximum: Equation  # M
    total: Equation  # L
    weights: Equation  # P
    out: Equation  # T
    masked: Expr  # S's value at T's softmax variable j: where(c, s, −∞), or s
    var: IndexVar  # j
    value: Expr  # V's load


def _node(model: Model, name: str) -> Equation | None:
    return next((e for e in model.nodes if e.target == name), None)


def _at(eq: Equation, indices: tuple) -> Expr:
    """eq's right-hand side at `indices` (its left-hand side's variables renamed)."""
    return rename_vars(eq.rhs, dict(zip(eq.lhs, indices, strict=True)))


def _intermediate_of(model: Model, name: str, readers: set[str]) -> Equation | None:
    """The node `name` where it is an intermediate that only `readers` read."""
    eq = _node(model, name)
    if eq is None or eq.scatter is not None or name in {t.name for t in model.outputs}:
        return None
    return eq if {c.target for c in consumers(model, name)} <= readers else None


def _weight(score: Expr, maximum: Load, masked: Expr) -> Expr:
    """where(c, exp(score − M), 0) where the scores are masked (`masked` = where(c, s, −∞)); exp(score − M)
    unmasked."""
    e = Op("exp", (Op("sub", (score, maximum)),))
    if isinstance(masked, Op) and masked.fn == "where" and isinstance(masked.args[2], NegInf):
        return Op("where", (masked.args[0], e, Const(Fraction(0))))
    return e


def chain_parts(model: Model, target: str) -> AttentionChain | None:
    """T's unfused attention nodes, or None where T is not `Σ j P·V` over such a chain."""
    out = _node(model, target)
    if out is None or out.scatter is not None or not isinstance(out.rhs, Reduce) or out.rhs.op != "sum" \
            or len(out.rhs.vars) != 1 or not isinstance(out.rhs.body, Op) or out.rhs.body.fn != "mul":
        return None
    j = out.rhs.vars[0]
    p_load, value = out.rhs.body.args
    if not isinstance(p_load, Load) or not isinstance(value, Load) or p_load.indices[-1:] != (j,):
        return None
    weights = _intermediate_of(model, p_load.tensor, {target})
    if weights is None or not all(isinstance(ix, IndexVar) for ix in p_load.indices):
        return None
    p_rhs = _at(weights, p_load.indices)
    if not (isinstance(p_rhs, Op) and p_rhs.fn in ("div", "div0") and isinstance(p_rhs.args[1], Load)):
        return None
    rows = p_load.indices[:-1]
    numerator, l_load = p_rhs.args
    body = numerator.args[1] if isinstance(numerator, Op) and numerator.fn == "where" else numerator
    if not (isinstance(body, Op) and body.fn == "exp" and isinstance(body.args[0], Op) and body.args[0].fn == "sub"):
        return None
    s_load, m_load = body.args[0].args
    if not isinstance(s_load, Load) or not isinstance(m_load, Load) or m_load.indices != rows \
            or l_load.indices != rows or s_load.indices != p_load.indices:  # type: ignore[union-attr]
        return None
    scores = _intermediate_of(model, s_load.tensor, {m_load.tensor, l_load.tensor, weights.target})  # type: ignore[union-attr]
    maximum, total = _node(model, m_load.tensor), _node(model, l_load.tensor)  # type: ignore[union-attr]
    if scores is None or maximum is None or total is None or maximum.scatter is not None or total.scatter is not None:
        return None
    masked = _at(scores, p_load.indices)
    if p_rhs != Op("div0" if numerator is not body else "div", (_weight(s_load, m_load, masked), l_load)):
        return None
    if not _row_reduction(maximum, rows, j, "max", s_load) \
            or not _row_reduction(total, rows, j, "sum", _weight(s_load, m_load, masked)):
        return None
    return AttentionChain(scores, maximum, total, weights, out, masked, j, value)


def _row_reduction(eq: Equation, rows: tuple, j: IndexVar, op: str, body: Expr) -> bool:
    """Whether eq, at `rows`, is `op j body` (its reduction variable renamed to j)."""
    if len(eq.lhs) != len(rows):
        return False
    rhs = _at(eq, rows)
    if not isinstance(rhs, Reduce) or rhs.op != op or len(rhs.vars) != 1 or rhs.vars[0].extent != j.extent:
        return False
    return rename_vars(rhs.body, {rhs.vars[0]: j}) == body


def _fresh(var: IndexVar, k: int) -> IndexVar:
    return IndexVar(var.name + "'" * (k + 1), var.extent)


def apply_fused(model: Model, target: str) -> Model:
    ch = chain_parts(model, target)
    assert ch is not None
    j = ch.var
    inlined = {ch.scores.target: ch.scores}
    maximum = replace(ch.maximum, rhs=inline_nodes(ch.maximum.rhs, inlined))
    total = replace(ch.total, rhs=inline_nodes(ch.total.rhs, inlined))
    softmax = softmax_along(ch.masked, j, [_fresh(j, k) for k in range(3)])
    out = replace(ch.out, rhs=Reduce("sum", (j,), Op("mul", (softmax, ch.value))))
    gone = {ch.scores.target, ch.weights.target}
    swap = {ch.maximum.target: maximum, ch.total.target: total, ch.out.target: out}
    nodes = tuple(swap.get(e.target, e) for e in model.nodes if e.target not in gone)
    return replace(model, nodes=nodes, intermediates=tuple(t for t in model.intermediates if t.name not in gone))


def fused_view(model: Model) -> Model:
    """The model with every `fused:T` rewrite that applies to it applied (itself where none does)."""
    for eq in model.nodes:
        if chain_parts(model, eq.target) is not None:
            return fused_view(apply_fused(model, eq.target))
    return model


# ----------------------------------------------------------------------------- the statistics the kernel stores


@dataclass(frozen=True)
class Statistics:
    """A softmax-weighted sum's row statistics that the model keeps as nodes: `maximum[rows] = max j x` and
    `total[rows] = Σ j where(c, exp(x − maximum), 0)` for x = where(c, s, −∞), T's masked scores."""

    maximum: str
    total: str
    out: str


def attention_statistics(model: Model, nodes: tuple[str, ...]) -> Statistics | None:
    """`nodes` = (M, L, T) where M and L are the maximum and the sum of T's softmax (as `fused:T` leaves them),
    T a softmax-weighted sum over j whose other indices but its last are M's; else None."""
    if len(nodes) != 3:
        return None
    eqs = [_node(model, n) for n in nodes]
    if any(e is None or e.scatter is not None for e in eqs):
        return None
    maximum, total, out = eqs
    parts = match_softmax_sum(out)  # type: ignore[arg-type]
    if parts is None or parts.row_guard is not None or len(parts.lhs) < 2:
        return None
    rows, j = parts.lhs[:-1], parts.var
    masked = Op("where", (parts.mask, parts.scores, NegInf())) if parts.mask is not None else parts.scores
    if not _row_reduction(maximum, rows, j, "max", masked) or not _row_reduction(  # type: ignore[arg-type]
            total, rows, j, "sum", _weight(masked, Load(nodes[0], rows), masked)):  # type: ignore[arg-type]
        return None
    return Statistics(*nodes)


def join_statistics(model: Model, regions: tuple[Region, ...]) -> tuple[Region, ...]:
    """`regions` with the general regions of a softmax-weighted sum's statistics (`attention_statistics`) joined to
    its own: one region (M, L, T) that the fused attention kernel computes whole, where T's was."""
    singles = [r.nodes[0] for r in regions if r.kind == "general" and len(r.nodes) == 1]
    sums = [t for t in singles if match_softmax_sum(_node(model, t)) is not None]  # type: ignore[arg-type]
    joined = {t: (mx, total, t) for t in sums for mx, total in permutations(singles, 2)
              if attention_statistics(model, (mx, total, t)) is not None}
    gone = {n for names in joined.values() for n in names[:-1]}
    return tuple(Region("general", joined[r.nodes[-1]]) if r.kind == "general" and r.nodes[-1] in joined else r
                 for r in regions if not (r.kind == "general" and r.nodes[0] in gone))


__all__ = ["AttentionChain", "Statistics", "apply_fused", "attention_statistics", "chain_parts", "fused_view",
           "join_statistics"]
