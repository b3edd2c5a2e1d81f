"""The online-softmax rewrite: a softmax-weighted sum computed tile by tile along the softmax axis.

A node of the form (what `softmax_j(x)` in a reduction over j writes, with an optional mask and
an optional row guard `where(row_cond, ..., 0)`)

    O[r] = Σ j softmax_j(where(c, s, −∞))[r j] · v[r j]

is computed over KV tiles of `tile` positions with running values per row (FlashAttention's
online softmax): for each tile t,

    m_t = max(m_{t−1}, max_{j in t} where(c, s, −∞))          the running maximum
    α_t = exp(m_{t−1} − m_t)                                  the rescale of what came before
    l_t = l_{t−1} · α_t + Σ_{j in t} where(c, exp(s − m_t), 0)
    o_t = o_{t−1} · α_t + Σ_{j in t} where(c, exp(s − m_t), 0) · v

and O = o_T / l_T, so the scores never exist for a whole row. The rewrite is kept only when the
check over Z_q × GF(p) (`habu.spec.field_exp`, where exp(a + b) = exp(a)·exp(b) exactly) finds the
tiled computation equal to the model as written (`check_online_softmax`); docs/VERIFY.md says why
that check is sound for this rewrite and what it cannot see (the choice of m).

`run_online` evaluates the tiled computation in any domain (float64 for golden checks, the fields
for the proof); a `Variant` plants the mistakes the mutation suite (habu/bench/mutants.py) checks
that the proof rejects.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from habu.errors import HabuError
from habu.spec.evaluate import Evaluator, Labelled, _align, _union, bind_inputs
from habu.spec.field_exp import ExpField, check_exp_arguments, evaluate_exp_field, random_inputs
from habu.spec.ir import Const, Equation, Expr, IndexVar, Model, NegInf, Op, Reduce, rename_vars
from habu.spec.reference import Float64


class Variant(enum.Enum):
    """The tiled computation as it should be, and planted mistakes (for the mutation suite)."""

    CORRECT = "correct"
    RESCALE_INVERTED = "rescale-inverted"  # α = exp(m_t − m_{t−1})
    NO_RESCALE = "no-rescale"  # α = 1: earlier tiles keep their old shift
    STALE_MAX = "stale-max"  # the tile's weights use m_t but the running max is not updated
    SUM_NOT_RESCALED = "sum-not-rescaled"  # l is not rescaled, o is


@dataclass(frozen=True)
class SoftmaxSum:
    """The parts of a softmax-weighted sum node."""

    target: str
    lhs: tuple[IndexVar, ...]
    var: IndexVar  # j, the softmax axis
    scores: Expr  # s
    mask: Expr | None  # c (a Compare), None: unmasked
    value: Expr  # v
    row_guard: Expr | None  # the condition of an outer where(cond, ..., 0)


class OnlineSoftmaxError(HabuError):
    """The online-softmax rewrite does not apply, or its check failed."""


def _strip_mask(x: Expr) -> tuple[Expr, Expr | None]:
    if isinstance(x, Op) and x.fn == "where" and isinstance(x.args[2], NegInf):
        return x.args[1], x.args[0]
    return x, None


def match_softmax_sum(eq: Equation) -> SoftmaxSum | None:
    """The node's parts when it is Σ j softmax_j(x) · v (as `softmax_along` builds it)."""
    rhs, guard = eq.rhs, None
    if isinstance(rhs, Op) and rhs.fn == "where" and rhs.args[2] == Const(Fraction(0)):
        rhs, guard = rhs.args[1], rhs.args[0]
    if not (isinstance(rhs, Reduce) and rhs.op == "sum" and len(rhs.vars) == 1):
        return None
    var = rhs.vars[0]
    body = rhs.body
    if not (isinstance(body, Op) and body.fn == "mul" and isinstance(body.args[0], Op) and body.args[0].fn in ("div", "div0")):
        return None
    num, den = body.args[0].args
    value = body.args[1]
    mask = None
    if isinstance(num, Op) and num.fn == "where":
        mask, num = num.args[0], num.args[1]
    if not (isinstance(num, Op) and num.fn == "exp" and isinstance(num.args[0], Op) and num.args[0].fn == "sub"):
        return None
    x, mx = num.args[0].args
    if not (isinstance(mx, Reduce) and mx.op == "max" and len(mx.vars) == 1):
        return None
    scores, inner_mask = _strip_mask(x)
    if inner_mask != mask:
        return None
    # the max and the denominator must be the same softmax, along j
    if rename_vars(mx.body, {mx.vars[0]: var}) != x or not isinstance(den, Reduce) or den.op != "sum":
        return None
    from habu.spec.equation import softmax_along

    j2 = den.vars[0]
    inner = den.body.args[1] if mask is not None else den.body  # type: ignore[union-attr]
    if not isinstance(inner, Op) or inner.fn != "exp":
        return None
    mx3 = inner.args[0].args[1]  # type: ignore[union-attr]
    if not isinstance(mx3, Reduce):
        return None
    if softmax_along(x, var, [mx.vars[0], j2, mx3.vars[0]]) != body.args[0]:
        return None
    return SoftmaxSum(eq.target, eq.lhs, var, scores, mask, value, guard)


# ----------------------------------------------------------------------------- evaluation, tile by tile


def _max_identity(domain) -> np.ndarray:
    """The running maximum before any tile: −∞ in float64; over a field the empty product 1 (a max
    reduction is modelled as prod(r − x), and partial maxima combine by multiplication)."""
    return np.asarray(-np.inf) if isinstance(domain, Float64) else domain.const(Fraction(1))


def _max_combine(domain, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.maximum(a, b) if isinstance(domain, Float64) else domain.op("mul", [a, b])


def run_online(model: Model, target: str, inputs: dict[str, np.ndarray], domain, tile: int,
               sizes: dict[str, int] | None = None, variant: Variant = Variant.CORRECT) -> np.ndarray:
    """The node `target` computed with the online softmax over tiles of `tile` positions of the
    softmax axis, in `domain` (Float64, PrimeField or ExpField); the other nodes as written."""
    eq = next(e for e in model.nodes if e.target == target)
    parts = match_softmax_sum(eq)
    if parts is None:
        raise OnlineSoftmaxError(f"{target} is not a softmax-weighted sum Σ j softmax_j(x) · v")
    bound = bind_inputs(model, inputs, where="input", fixed=sizes)
    ev = Evaluator(model, bound, domain)
    ev.run(inputs)  # every node, so that intermediates the softmax reads are there
    j = parts.var
    labels = _union(eq.lhs, (j,))
    axis = labels.index(j)

    def full(e: Expr | None, default: Fraction) -> np.ndarray:
        val = ev.expr(e) if e is not None else Labelled(domain.const(default), ())
        return _align(val, labels)

    s, v = full(parts.scores, Fraction(0)), full(parts.value, Fraction(0))
    c = full(parts.mask, Fraction(1))
    zero = domain.const(Fraction(0))
    held = np.asarray(c != zero)
    n = bound[j.extent]
    shape = [1] * len(labels)
    m = np.broadcast_to(_max_identity(domain), shape).copy()
    l_run = np.broadcast_to(zero, shape).copy()
    o_run = np.broadcast_to(zero, shape).copy()
    seen = np.zeros(shape, dtype=bool)
    one = domain.const(Fraction(1))
    for lo in range(0, n, tile):
        sl = [slice(None)] * len(labels)
        sl[axis] = slice(lo, min(n, lo + tile))

        def take(x: np.ndarray, sl=tuple(sl)) -> np.ndarray:
            return x[sl] if x.shape[axis] > 1 else x

        s_t, v_t, c_t, held_t = take(s), take(v), take(c), take(held)
        x_t = domain.op("where", [c_t, s_t, domain.neg_inf()])
        tile_max = np.expand_dims(domain.reduce("max", x_t, (axis,)), axis)
        m_new = _max_combine(domain, m, tile_max)
        seen_new = seen | np.any(held_t, axis=axis, keepdims=True)
        if variant is Variant.RESCALE_INVERTED:
            diff = domain.op("sub", [m_new, m])
        else:
            diff = domain.op("sub", [m, m_new])
        alpha = np.where(seen, domain.op("exp", [diff]), one)  # nothing seen yet: l = o = 0, keep them
        if variant is Variant.NO_RESCALE:
            alpha = np.broadcast_to(one, np.shape(alpha))
        p_t = domain.op("where", [c_t, domain.op("exp", [domain.op("sub", [s_t, m_new])]), zero])
        p_sum = np.expand_dims(domain.reduce("sum", np.broadcast_to(p_t, np.broadcast_shapes(p_t.shape, c_t.shape)),
                                             (axis,)), axis)
        pv = domain.op("mul", [p_t, v_t])
        pv_sum = np.expand_dims(domain.reduce("sum", pv, (axis,)), axis)
        l_old = l_run if variant is Variant.SUM_NOT_RESCALED else domain.op("mul", [l_run, alpha])
        l_run = domain.op("add", [l_old, p_sum])
        o_run = domain.op("add", [domain.op("mul", [o_run, alpha]), pv_sum])
        if variant is not Variant.STALE_MAX:
            m = m_new
        seen = seen_new
    out = domain.op("div0", [o_run, l_run])  # a fully masked row (l = 0) is 0, as the model's softmax_j
    if parts.row_guard is not None:
        out = domain.op("where", [full(parts.row_guard, Fraction(1)), out, zero])
    out = np.squeeze(out, axis=axis)
    full_shape = tuple(bound[x.extent] for x in eq.lhs)
    return np.broadcast_to(out, full_shape).copy()  # (a scalar stays 0-d: np.ascontiguousarray gives it one axis)


# ----------------------------------------------------------------------------- the check


def witness_sizes(model: Model, axis: str, tile: int, cap: int = 6) -> dict[str, int]:
    """Small sizes for the check: every extent at most `cap`, the softmax axis 2.5 tiles + 1 (three
    tiles, the last one ragged)."""
    sizes = {e.name: min(e.size or e.lo, cap) for e in model.extents}
    sizes[axis] = 2 * tile + tile // 2 + 1
    return sizes


def check_online_softmax(model: Model, target: str, tile: int, trials: int = 3, seed: int = 0,
                         variant: Variant = Variant.CORRECT, sizes: dict[str, int] | None = None) -> str | None:
    """None when the tiled computation of `target` equals the model over Z_q × GF(p) in `trials`
    trials; otherwise where it first differs."""
    check_exp_arguments(model)
    eq = next(e for e in model.nodes if e.target == target)
    parts = match_softmax_sum(eq)
    if parts is None:
        raise OnlineSoftmaxError(f"{target} is not a softmax-weighted sum Σ j softmax_j(x) · v")
    if sizes is None:
        sizes = witness_sizes(model, parts.var.extent, tile)
    model = model.with_sizes(sizes)
    for trial in range(trials):
        field = ExpField(seed=seed + 1000 * trial)
        rng = np.random.default_rng(seed + trial)
        ins = random_inputs(model, field, sizes, rng)
        want = evaluate_exp_field(model, ins, field, sizes)[target]
        got = run_online(model, target, ins, field, tile, sizes, variant)
        bad = np.argwhere(got != want)
        if len(bad):
            at = [int(i) for i in bad[0]]
            return f"{target}{at} differs from the model over {field.name} in trial {trial + 1}"
    return None


def online_softmax(model: Model, target: str, tile: int, trials: int = 3) -> SoftmaxSum:
    """The rewrite of `target`, after its check passed (an OnlineSoftmaxError otherwise)."""
    eq = next((e for e in model.nodes if e.target == target), None)
    parts = match_softmax_sum(eq) if eq is not None else None
    if parts is None:
        raise OnlineSoftmaxError(f"rewrite online:{target} does not apply to model {model.name}")
    failure = check_online_softmax(model, target, tile, trials)
    if failure is not None:
        raise OnlineSoftmaxError(f"online:{target} failed its finite-field check: {failure}")
    return parts


def applicable(model: Model) -> list[str]:
    """The nodes the online softmax applies to."""
    return [eq.target for eq in model.nodes if match_softmax_sum(eq) is not None]
