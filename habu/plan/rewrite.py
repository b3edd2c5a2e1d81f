"""Algebraic rewrites of a model's equation graph: the same values, computed another way.

A plan names the rewrites it was built on (`Plan.rewrites`); every consumer of the plan (the
lowering, the rules, the finite-field check, the emitter) applies them to the model first, while
the float64 and finite-field references keep evaluating the model as written. So a rewrite is kept
only when the finite-field check of the rewritten plan against the original model passes.

- `inline:P` hoists a copy into the contraction that reads it: `P[r k] = X[IX[r] k]` followed by
  `T = Σ k P[m k]·B[n k]` becomes `T = Σ k X[IX[m] k]·B[n k]` (the gather moves into the operand
  load; P is never written).
- `split:T` makes a contraction written inside T's larger expression a node of its own, T.mm
  (habu/plan/split.py); default plans take it.
- `attention:T` makes a softmax-weighted sum (attention) three nodes: the scores T.s, each row's
  softmax T.p and the value contraction T (habu/plan/attention_split.py: the unfused plan); default
  plans take it (then `split:T.s`).
- `fused:T` is the inverse where the model keeps the softmax's row maximum and sum as nodes (a training forward):
  the scores and the weights inlined, T one softmax-weighted sum again, which the fused attention kernel computes
  and stores the statistics beside (habu/plan/attention_fused.py). Only under `--pin family=attention` and the
  default's fused prefill.
- `factor:T` moves a row scale out of a contraction (Mirage's RMSNorm + Linear rewrite): with
  `P[r k] = X[r k] · s(r)` and `T[m n] = Σ k P[m k]·B[k n]`, since s does not depend on k,
  `T[m n] = s(m) · Σ k X[m k]·B[k n]`: a row statistic `T.scale[m] = s(m)` (one read of X, one
  number per row), the contraction over X itself, and the scale applied in its epilogue.
- `scatter:T` takes a contraction's scatter-add store out of its epilogue (`T[IX[m] k] += Σ n …` becomes
  the plain product T.mm, stored in f32, and `T[IX[m] k] += T.mm[m k]`, a scatter-add kernel:
  habu/plan/scatter_split.py); the default takes it where the cost model predicts it faster.
- `gather:T` copies an operand a contraction gathers on its reduction axis out first (`T.g[m k] =
  A[IX[m] k]`, then the contraction over T.g: habu/plan/gather_split.py), instead of its staging pass.
- `epilogue:P` substitutes an elementwise node into the one contraction epilogue node that reads it (a
  derived backward's recomputed GELU input `T2 = S1 + B1`, read by the GELU derivative in the epilogue of
  `Σ d dT6·W2`: habu/plan/epilogue_inline.py); P is never written. Default plans take it.
- `terms:T` makes each grouped GEMM among the terms of T's sum a node of its own, T.t0, T.t1, … in f32, and T
  their sum with the rest (a derived MoE backward's `dX[IX[r] d] += Σ h dTup·W3[E[r] h d] + Σ h dTgate·W1[…]`:
  habu/plan/term_split.py). Default plans take it.
- `inner:T` makes a grouped GEMM nested in T's reduction a node of its own, T.in in f32 (the MoE backward's
  `dP[r] = Σ d dY[IX[r] d] · (Σ h Sact[r h] · W2[E[r] d h])`: habu/plan/inner_split.py). Default plans take it.
- `nest:T` makes a product summed over several variables a batched contraction over one of them, T.in in f32 over
  the others and T's, and T their sum (attention's derived `dK[b g j e] = Σ r i dS·Q` with grouped queries:
  habu/plan/nest_split.py). Default plans take it.
- `storage:bf16` stores every matrix between kernels in bf16 (habu/plan/storage_pin.py): only by `--pin
  storage=bf16`, applied after the others; no node names it, so the search never offers it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from itertools import combinations

from habu.errors import HabuError
from habu.plan.attention_fused import apply_fused, chain_parts
from habu.plan.attention_split import apply_attention, attention_parts
from habu.plan.epilogue_inline import apply_epilogue, epilogue_part
from habu.plan.gather_split import apply_gather, gather_part
from habu.plan.inner_split import apply_inner, inner_part
from habu.plan.nest_split import apply_nest, nest_part
from habu.plan.patterns import _factors, as_contraction, consumers
from habu.plan.scatter_split import apply_scatter, scatter_part
from habu.plan.split import apply_split, split_part
from habu.plan.storage_pin import apply_storage, storage_part
from habu.plan.term_split import apply_terms, terms_part
from habu.spec.ir import (
    Equation,
    Expr,
    IndexVar,
    Load,
    Model,
    Op,
    Reduce,
    TensorDecl,
    free_vars,
    rename_vars,
    walk,
)


class RewriteError(HabuError):
    """A plan names a rewrite that does not apply to the model."""


def _node(model: Model, target: str) -> Equation | None:
    return next((eq for eq in model.nodes if eq.target == target), None)


def _is_intermediate(model: Model, name: str) -> bool:
    return any(t.name == name for t in model.intermediates)


# ----------------------------------------------------------------------------- inline:P


def _inline_ok(model: Model, name: str) -> bool:
    eq = _node(model, name)
    if eq is None or not _is_intermediate(model, name) or not isinstance(eq.rhs, Load):
        return False
    readers = consumers(model, name)
    return bool(readers) and all(as_contraction(r) is not None and _inlined(r, eq) is not None for r in readers)


def _substitute(expr: Expr, eq: Equation) -> Expr:
    """`expr` with every load of eq's target replaced by eq's right-hand side at that load's indices."""
    if isinstance(expr, Load):
        if expr.tensor != eq.target:
            return expr
        mapping = dict(zip(eq.lhs, expr.indices, strict=True))
        return rename_vars(eq.rhs, mapping)
    if isinstance(expr, Op):
        return Op(expr.fn, tuple(_substitute(a, eq) for a in expr.args))
    if isinstance(expr, Reduce):
        return Reduce(expr.op, expr.vars, _substitute(expr.body, eq))
    return expr


def _inlined(reader: Equation, eq: Equation) -> Equation | None:
    """The reader with eq inlined, if it is still a contraction Habu's kernels compute."""
    for ld in walk(reader.rhs):
        if isinstance(ld, Load) and ld.tensor == eq.target and not all(isinstance(ix, IndexVar) for ix in ld.indices):
            return None  # a load of P through a gather: composing the gathers is not supported
    new = Equation(reader.target, reader.lhs, _substitute(reader.rhs, eq))
    return new if as_contraction(new) is not None else None


def _apply_inline(model: Model, name: str) -> Model:
    eq = _node(model, name)
    assert eq is not None
    nodes = []
    for n in model.nodes:
        if n.target == name:
            continue
        nodes.append(_inlined(n, eq) or n if any(ld.tensor == name for ld in walk(n.rhs) if isinstance(ld, Load))
                     else n)
    return replace(model, nodes=tuple(nodes), intermediates=tuple(t for t in model.intermediates if t.name != name))


# ----------------------------------------------------------------------------- factor:T


def _factor_parts(model: Model, target: str) -> tuple[Equation, Expr, Expr, str] | None:
    """For contraction `target` reading an intermediate P whose value is (k-free factors) · (the rest):
    (P's equation, the row scale over P's row variable, the rest, "a" or "b")."""
    eq = _node(model, target)
    c = as_contraction(eq) if eq is not None else None
    if c is None:
        return None
    for side, op in (("a", c.a), ("b", c.b)):
        if op.gather is not None or op.k_gather is not None or not _is_intermediate(model, op.load.tensor):
            continue
        p = _node(model, op.load.tensor)
        if p is None or consumers(model, p.target) != [eq] or len(p.lhs) != 2:
            continue
        row_var, col_var = p.lhs[op.axis_pos], p.lhs[op.k_pos]
        scale, rest = [], []
        for f in _factors(p.rhs):
            (rest if col_var in free_vars(f) else scale).append(f)
        if not scale or not rest or not any(row_var in free_vars(f) for f in scale):
            continue
        if any(free_vars(f) - {row_var} for f in scale):
            continue
        return p, _product(scale), _product(rest), side
    return None


def _product(factors: list[Expr]) -> Expr:
    out = factors[0]
    for f in factors[1:]:
        out = Op("mul", (out, f))
    return out


def _apply_factor(model: Model, target: str) -> Model:
    found = _factor_parts(model, target)
    assert found is not None
    p, scale, rest, side = found
    eq = _node(model, target)
    c = as_contraction(eq)
    assert eq is not None and c is not None
    op = c.a if side == "a" else c.b
    row_var = p.lhs[op.axis_pos]
    scale_name, sum_name = f"{target}.scale", f"{target}.sum"
    # the row statistic, over P's row variable
    stat = Equation(scale_name, (row_var,), scale)
    # the contraction over the rest, read where it read P
    rest_eq = Equation(p.target, p.lhs, rest)
    summed = Equation(sum_name, eq.lhs, _substitute(eq.rhs, rest_eq))
    if as_contraction(summed) is None:  # the rest is not a plain load: keep it as its own node
        summed = Equation(sum_name, eq.lhs, eq.rhs)
        kept_p = [rest_eq]
    else:
        kept_p = []
    axis = c.m if side == "a" else c.n
    apply = Equation(target, eq.lhs, Op("mul", (Load(sum_name, eq.lhs), Load(scale_name, (axis,)))))
    nodes: list[Equation] = []
    for n in model.nodes:
        if n.target == p.target:
            nodes += [stat, *kept_p]
        elif n.target == target:
            nodes += [summed, apply]
        else:
            nodes.append(n)
    out_decl = model.tensor(target)
    p_decl = model.tensor(p.target)
    row_extent = p_decl.extents[op.axis_pos]
    inter: list[TensorDecl] = []
    for t in model.intermediates:
        if t.name == p.target:
            inter.append(TensorDecl(scale_name, (row_extent,), None))
            if kept_p:
                inter.append(t)
        else:
            inter.append(t)
    inter.append(TensorDecl(sum_name, out_decl.extents, None))
    return replace(model, nodes=tuple(nodes), intermediates=tuple(inter))


# ----------------------------------------------------------------------------- the catalogue

KINDS = {"inline": (_inline_ok, _apply_inline),
         "factor": (lambda m, t: _factor_parts(m, t) is not None, _apply_factor),
         "split": (lambda m, t: split_part(m, t) is not None, apply_split),
         "attention": (lambda m, t: attention_parts(m, t) is not None, apply_attention),
         # the inverse, for the fused kernel storing the row statistics: only under --pin family=attention
         "fused": (lambda m, t: chain_parts(m, t) is not None, apply_fused),
         "scatter": (lambda m, t: scatter_part(m, t) is not None, apply_scatter),
         "gather": (lambda m, t: gather_part(m, t) is not None, apply_gather),
         "epilogue": (lambda m, t: epilogue_part(m, t) is not None, apply_epilogue),
         "terms": (lambda m, t: terms_part(m, t) is not None, apply_terms),
         "inner": (lambda m, t: inner_part(m, t) is not None, apply_inner),
         "nest": (lambda m, t: nest_part(m, t) is not None, apply_nest),
         # a plan's storage type (habu/plan/storage_pin.py): never applicable by node, only pinned (`--pin storage=`)
         "storage": (lambda m, t: storage_part(m, t) is not None, apply_storage)}


def default_rewrites(model: Model) -> tuple[str, ...]:
    """The rewrites a default plan takes without being asked: `attention:T` for every softmax-weighted
    sum (the unfused attention plan), `terms:T` for every sum of grouped GEMMs, `inner:T` for every grouped
    GEMM nested in a reduction and `nest:T` for every product summed over several variables, then `split:T` for every contraction written inside a larger
    expression (without it no contraction family takes the node), then `epilogue:P` for every
    elementwise node that one contraction epilogue reads (one at a time: each may enable the next)."""
    first = tuple(name for name in applicable(model) if name.startswith(("attention:", "terms:", "inner:", "nest:")))
    after = apply_rewrites(model, first) if first else model
    names = first + tuple(name for name in applicable(after) if name.startswith("split:"))
    while True:
        after = apply_rewrites(model, names)
        more = next((name for name in applicable(after) if name.startswith("epilogue:")), None)
        if more is None:
            return names
        names = (*names, more)


def applicable(model: Model) -> list[str]:
    """Every rewrite that applies to the model as it stands, in model order."""
    out = []
    for eq in model.nodes:
        for kind, (ok, _) in KINDS.items():
            if ok(model, eq.target):
                out.append(f"{kind}:{eq.target}")
    return out


def apply_rewrites(model: Model, names: tuple[str, ...]) -> Model:
    """The model with the rewrites applied in order (the model itself for none); a rewrite that
    does not apply is an error. Models are immutable, so the result is remembered: the search asks
    for the same graph for every candidate of a region."""
    return _apply_rewrites(model, tuple(names))


@lru_cache(maxsize=64)
def _apply_rewrites(model: Model, names: tuple[str, ...]) -> Model:
    for name in names:
        kind, _, target = name.partition(":")
        if kind not in KINDS:
            raise RewriteError(f"unknown rewrite {name!r} (known: {', '.join(f'{k}:NODE' for k in KINDS)})")
        ok, apply = KINDS[kind]
        if not ok(model, target):
            raise RewriteError(f"rewrite {name!r} does not apply to model {model.name}")
        model = apply(model, target)
    return model


def rewrite_sets(model: Model, limit: int = 16) -> list[tuple[str, ...]]:
    """The rewrite sequences to try: none first, then each applicable rewrite alone, then pairs
    and so on (each applied to the result of the previous), each set once, at most `limit`."""
    out: list[tuple[str, ...]] = [()]
    first = applicable(model)
    for size in range(1, len(first) + 1):
        for combo in combinations(first, size):
            try:
                apply_rewrites(model, combo)
            except RewriteError:
                continue
            out.append(combo)
            if len(out) >= limit:
                return out
    return out


def planned_model(model: Model, plan) -> Model:
    """The model a plan's kernels compute: `model` with the plan's rewrites applied, its runtime
    extents narrowed to the plan's `ranges` (a size bucket: habu/plan/buckets.py) or to the one size
    its `shape` gives them."""
    from habu.plan.buckets import restricted

    ranges = tuple(getattr(plan, "ranges", ()))
    ranged = {r[0] for r in ranges}
    runtime = {e.name for e in model.extents if not e.is_static}
    ranges += tuple((n, v, v) for n, v in getattr(plan, "shape", ()) if n in runtime and n not in ranged)
    return apply_rewrites(restricted(model, ranges), getattr(plan, "rewrites", ()))


__all__ = ["RewriteError", "applicable", "apply_rewrites", "planned_model", "rewrite_sets"]
