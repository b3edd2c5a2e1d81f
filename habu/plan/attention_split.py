"""`attention:T`: a softmax-weighted sum becomes the unfused attention plan's nodes.

A node `O[..] = Σ j softmax_j(where(c, Σ e Q·K · scale, −∞)) · V` (what `softmax_j` in a reduction
over j writes; habu.plan.online_softmax.match_softmax_sum finds its parts) is rewritten as

    T.s[.. j] = where(c, (Σ e Q·K) · scale, −∞)       the scores (the constant factors of the product
                                                      taken out of the Σ, so `split:T.s` makes the
                                                      product a batched contraction node of its own)
    T.m[..]   = max j T.s[.. j]                        each row's softmax: its maximum,
    T.l[..]   = Σ j where(c, exp(T.s[.. j] − T.m), 0)   its sum and its weights (the mask applied
    T.p[.. j] = div0(where(c, exp(T.s − T.m), 0), T.l)  again: over GF(p) exp(−∞) is no 0, and masked
                                                      positions must weigh 0 there too; div0: a
                                                      fully masked row, whose sum is 0, is 0)
    T[..]     = Σ j T.p[.. j] · V                       the value contraction (a row guard
                                                      `where(g, ..., 0)` around the sum is kept)

T.s's indices are T's that the scores read, then j. The same values: the model as written and the
rewritten one are equal as rational functions (T.s is the model's masked scores, so T.m is its max
and the weights its weights; the constant factor of a sum distributes over it; the row statistics
are hoisted out of each element's loops, where the general family would repeat them), and the finite-field check of the rewritten plan against the model as
written proves it like any other rewrite. This is the fallback plan of issue 22 (FlashAttention's
fused kernel is a later family), and the baseline of the online softmax (habu/plan/online_softmax.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from habu.plan.online_softmax import SoftmaxSum, match_softmax_sum
from habu.spec.ir import (
    Compare,
    Const,
    Equation,
    Expr,
    IndexVar,
    Load,
    Model,
    NegInf,
    Op,
    Reduce,
    TensorDecl,
    free_vars,
    rename_vars,
    walk,
)


def attention_parts(model: Model, target: str) -> SoftmaxSum | None:
    """T's softmax-weighted sum, when T is one whose scores read no softmax of their own; else None."""
    eq = next((e for e in model.nodes if e.target == target), None)
    if eq is None or eq.scatter is not None:
        return None
    parts = match_softmax_sum(eq)
    if parts is None or any(isinstance(x, Op) and x.fn == "exp" for x in walk(parts.scores)):
        return None
    if parts.var in eq.lhs or not _score_vars(parts):
        return None
    return parts


def _score_vars(parts: SoftmaxSum) -> tuple[IndexVar, ...]:
    """T.s's indices: T's indices the (masked) scores read, in T's order, then j."""
    used = free_vars(parts.scores) | (free_vars(parts.mask) if parts.mask is not None else set())
    return (*(v for v in parts.lhs if v in used), parts.var)


def _factors(e: Expr) -> list[Expr]:
    if isinstance(e, Op) and e.fn == "mul":
        return _factors(e.args[0]) + _factors(e.args[1])
    return [e]


def _product(factors: list[Expr]) -> Expr:
    out = factors[0]
    for f in factors[1:]:
        out = Op("mul", (out, f))
    return out


def _constants_out(scores: Expr) -> Expr:
    """`Σ e A·B·rsqrt(#E)` as `(Σ e A·B) · rsqrt(#E)`: the factors that read no tensor and no index
    leave the sum (the product alone is what the contraction families take)."""
    if not isinstance(scores, Reduce) or scores.op != "sum":
        return scores
    inside, outside = [], []
    for f in _factors(scores.body):
        constant = not free_vars(f) and not any(isinstance(x, Load) for x in walk(f))
        (outside if constant else inside).append(f)
    if not outside or not inside:
        return scores
    return Op("mul", (Reduce("sum", scores.vars, _product(inside)), _product(outside)))


def _fresh(var: IndexVar, k: int) -> IndexVar:
    return IndexVar(var.name + "'" * (k + 1), var.extent)


def apply_attention(model: Model, target: str) -> Model:
    parts = attention_parts(model, target)
    assert parts is not None
    eq = next(e for e in model.nodes if e.target == target)
    j = parts.var
    s_vars = _score_vars(parts)
    s_name, m_name, l_name, p_name = (f"{target}.{x}" for x in "smlp")
    scores = _constants_out(parts.scores)
    masked = Op("where", (parts.mask, scores, NegInf())) if parts.mask is not None else scores
    s_node = Equation(s_name, s_vars, masked)
    rows = s_vars[:-1]
    j1 = _fresh(j, 0)
    m_node = Equation(m_name, rows, Reduce("max", (j1,), Load(s_name, (*rows, j1))))

    def weight(v: IndexVar) -> Expr:  # where(c, exp(T.s − T.m), 0): masked positions weigh 0 in every domain
        e = Op("exp", (Op("sub", (Load(s_name, (*rows, v)), Load(m_name, rows))),))
        return e if parts.mask is None else Op("where", (rename_vars(parts.mask, {j: v}), e, Const(Fraction(0))))

    l_node = Equation(l_name, rows, Reduce("sum", (j1,), weight(j1)))
    p_node = Equation(p_name, s_vars, Op("div0" if parts.mask is not None else "div", (weight(j), Load(l_name, rows))))
    total: Expr = Reduce("sum", (j,), Op("mul", (Load(p_name, s_vars), parts.value)))
    if parts.row_guard is not None:
        total = Op("where", (parts.row_guard, total, Const(Fraction(0))))
    o_node = replace(eq, rhs=total)
    nodes: list[Equation] = []
    for e in model.nodes:
        nodes += [s_node, m_node, l_node, p_node, o_node] if e is eq else [e]
    extents = tuple(v.extent for v in s_vars)
    decls = (TensorDecl(s_name, extents, None), TensorDecl(m_name, extents[:-1], None),
             TensorDecl(l_name, extents[:-1], None), TensorDecl(p_name, extents, None))
    return replace(model, nodes=tuple(nodes), intermediates=(*model.intermediates, *decls))


# ----------------------------------------------------------------------------- the fused kernel's form


@dataclass(frozen=True)
class AttentionForm:
    """A softmax-weighted sum the fused attention kernel (habu/lower/attention.py) computes:
    `O[batch.. i d] = Σ j softmax_j(where(mask, Σ e Q[.. i e]·K[.. j e] · scale, −∞)) · V[.. j d]`, with
    i the query row (the index Q reads and K does not, the last such), d the value column, e and d the
    innermost (contiguous) indices of Q, K and V, every load bf16 with plain index variables, and the
    batch variables (b, g, r: K and V read a subset of them, GQA) the rest of O's indices."""

    node: Equation
    q: Load
    k: Load
    v: Load
    row: IndexVar  # i
    key: IndexVar  # j
    red: IndexVar  # e
    col: IndexVar  # d
    batch: tuple[IndexVar, ...]  # O's other indices, in O's order
    scale: Expr | None  # constant factors of the product (rsqrt(#E))
    mask: Compare | None


def attention_form(model: Model, target: str) -> AttentionForm | None:
    """The fused kernel's form of node `target`, or None where the kernel does not take it."""
    eq = next((e for e in model.nodes if e.target == target), None)
    if eq is None or eq.scatter is not None:
        return None
    parts = match_softmax_sum(eq)
    if parts is None or parts.row_guard is not None or not isinstance(parts.value, Load):
        return None
    if parts.mask is not None and not isinstance(parts.mask, Compare):
        return None
    scores = _constants_out(parts.scores)
    scale: Expr | None = None
    if isinstance(scores, Op) and scores.fn == "mul" and isinstance(scores.args[0], Reduce):
        scores, scale = scores.args
    if not (isinstance(scores, Reduce) and scores.op == "sum" and len(scores.vars) == 1):
        return None
    loads = _factors(scores.body)
    if len(loads) != 2 or not all(isinstance(x, Load) for x in loads):
        return None
    j, e, v = parts.var, scores.vars[0], parts.value
    q, k = loads if j not in loads[1].indices[-1:] and j not in loads[0].indices else loads[::-1]
    assert isinstance(q, Load) and isinstance(k, Load) and isinstance(v, Load)
    if not all(isinstance(ix, IndexVar) for ld in (q, k, v) for ix in ld.indices):
        return None
    if any(model.tensor(ld.tensor).dtype is None or model.tensor(ld.tensor).dtype.name != "bf16" for ld in (q, k, v)):
        return None
    d = eq.lhs[-1] if eq.lhs else None
    if d is None or q.indices[-1] != e or k.indices[-1] != e or v.indices[-1] != d or j not in k.indices \
            or j not in v.indices or j in q.indices or d in q.indices or d in k.indices:
        return None
    rows = [x for x in q.indices if x not in k.indices and x != e]
    if not rows or rows[-1] not in eq.lhs or any(rows[-1] in ld.indices for ld in (k, v)):
        return None
    row = rows[-1]
    batch = tuple(x for x in eq.lhs if x not in (row, d))
    used = set(q.indices) | set(k.indices) | set(v.indices)
    if not set(batch) <= used | free_vars(parts.mask if parts.mask is not None else Const(Fraction(0))) \
            or any(x not in (*batch, row, e) for x in q.indices) or any(x not in (*batch, j, e) for x in k.indices) \
            or any(x not in (*batch, j, d) for x in v.indices):
        return None
    if len(set(q.indices)) != len(q.indices) or len(set(k.indices)) != len(k.indices):
        return None
    if parts.mask is not None and free_vars(parts.mask) - {*batch, row, j}:
        return None
    return AttentionForm(eq, q, k, v, row, j, e, d, batch, scale, parts.mask)


__all__ = ["AttentionForm", "apply_attention", "attention_form", "attention_parts"]
