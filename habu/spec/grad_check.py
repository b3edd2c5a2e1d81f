"""Checks of the backward derivation (`habu.spec.grad`).

- `adjoint_check`: over GF(p) with dual numbers. The forward model runs on x + ε·v in GF(p)[ε]/(ε²),
  where every function maps a + bε to f(a) + f′(a)·b·ε with f′ its derivative rule evaluated in the
  field (so exp, rsqrt, … stay keyed random functions, and their derivatives are whatever the rules
  say they are), a sum reduction sums both parts and a max reduction passes on the dual parts
  weighted by the arg-max indicator the rules use. Its ε part is J·v. The backward model, run over
  GF(p) on x, the saved values and u, gives Jᵀ·u, and ⟨u, J·v⟩ = ⟨Jᵀ·u, v⟩ must hold exactly for
  random u, v: a wrong transposition, a missing broadcast or sum, a scatter that does not undo its
  gather, fails with probability about 1 − 1/p per trial. The models are checked at small sizes
  (the derivation does not depend on sizes; size-1 extents stay 1).
- `finite_difference_check`: the same identity in float64, with J·v by central differences of the
  reference evaluator: checks the derivative rules in place.
- `rule_check`: each function's derivative rule against central differences at random points.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from habu.spec.evaluate import Evaluator, bind_inputs
from habu.spec.field import DEFAULT_PRIME, PairPacked, PrimeField, evaluate_field
from habu.spec.functions import FUNCTIONS
from habu.spec.grad import Backward
from habu.spec.ir import Const, Expr, Load, Model, fold_ops
from habu.spec.reference import Float64, evaluate

SMALL_SIZES = (3, 4, 5, 2, 6, 7)  # the sizes extents take in the checks, in order (size-1 extents stay 1)


def _rule(fn: str, i: int) -> Expr:
    f = FUNCTIONS[fn]
    assert f.derivative is not None
    return f.derivative(tuple(Load(f"${k}", ()) for k in range(f.arity)), i)


def eval_rule(fn: str, i: int, args: list[np.ndarray], domain) -> np.ndarray:
    """The derivative rule of `fn` by argument i, evaluated on `args` in `domain` (field or float64)."""

    def leaf(e: Expr) -> np.ndarray:
        if isinstance(e, Const):
            return domain.const(e.value)
        assert isinstance(e, Load) and e.tensor.startswith("$")
        return args[int(e.tensor[1:])]

    return fold_ops(_rule(fn, i), leaf, lambda o, a: domain.op(o.fn, list(a)))


class DualField(PairPacked):
    """GF(p)[ε]/(ε²): a + bε stored as a·2^31 + b in one int64, so that the evaluator's indexing,
    broadcasting and transposing work unchanged."""

    def __init__(self, field: PrimeField):
        self.field = field
        self.p = field.p
        self.name = f"{field.name}[ε]"

    def from_input(self, name: str, data: np.ndarray) -> np.ndarray:
        return np.asarray(data, dtype=np.int64)

    def const(self, value: Fraction) -> np.ndarray:
        return self.pack(self.field.const(value), np.asarray(0))

    def neg_inf(self) -> np.ndarray:
        return self.pack(self.field.neg_inf(), np.asarray(0))

    def op(self, fn: str, args: list[np.ndarray]) -> np.ndarray:
        parts = [self.split(a) for a in args]
        reals = [r for r, _ in parts]
        real = self.field.op(fn, reals)
        dual = np.zeros_like(real)
        for i, (_, d) in enumerate(parts):
            if not np.any(d):
                continue
            if FUNCTIONS[fn].derivative is None:
                raise ValueError(f"{fn} has no derivative rule")
            dual = (dual + eval_rule(fn, i, reals, self.field) * d) % self.p
        return self.pack(real, dual)

    def _weights(self, real: np.ndarray, maximum: np.ndarray, count) -> np.ndarray:
        f = self.field
        hit = f.op("sub", [f.const(Fraction(1)), f.op("step", [f.op("sub", [maximum, real])])])
        return f.op("div", [hit, count(hit)])

    def reduce(self, op: str, data: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        real, dual = self.split(data)
        f = self.field
        if op == "sum":
            return self.pack(f.reduce("sum", real, axes), f.reduce("sum", dual, axes))
        maximum = f.reduce("max", real, axes)
        spread = np.expand_dims(maximum, tuple(sorted(axes)))
        w = self._weights(real, spread, lambda hit: np.expand_dims(f.reduce("sum", hit, axes), tuple(sorted(axes))))
        return self.pack(maximum, f.reduce("sum", (w * dual) % self.p, axes))

    def repeat_sum(self, data: np.ndarray, count: int) -> np.ndarray:
        real, dual = self.split(data)
        return self.pack(self.field.repeat_sum(real, count), self.field.repeat_sum(dual, count))

    def repeat_max(self, data: np.ndarray, count: int) -> np.ndarray:
        real, dual = self.split(data)
        f = self.field
        maximum = f.repeat_max(real, count)
        w = self._weights(real, maximum, lambda hit: f.repeat_sum(hit, count))
        return self.pack(maximum, f.repeat_sum((w * dual) % self.p, count))

    def contract(self, operands: list[np.ndarray], subscripts: str) -> np.ndarray:
        parts = [self.split(o) for o in operands]
        reals = [r for r, _ in parts]
        real = self.field.contract(reals, subscripts)
        dual = np.zeros_like(real)
        for i, (_, d) in enumerate(parts):
            if np.any(d):
                dual = (dual + self.field.contract([*reals[:i], d, *reals[i + 1:]], subscripts)) % self.p
        return self.pack(real, dual)

    def scatter_add(self, target: np.ndarray, index: tuple[np.ndarray, ...], values: np.ndarray) -> np.ndarray:
        ta, tb = self.split(target)
        va, vb = self.split(np.broadcast_to(values, np.shape(index[0])) if index else values)
        return self.pack(self.field.scatter_add(ta, index, va), self.field.scatter_add(tb, index, vb))


# ----------------------------------------------------------------------------- the checks


@dataclass(frozen=True)
class AdjointResult:
    passed: bool
    detail: str


def small_sizes(model: Model) -> dict[str, int]:
    """Distinct small sizes for the model's extents (size-1 extents stay 1)."""
    out, k = {}, 0
    for e in model.extents:
        if e.size == 1:
            out[e.name] = 1
        else:
            out[e.name] = SMALL_SIZES[k % len(SMALL_SIZES)]
            k += 1
    return out


def _bind(model: Model, sizes: dict[str, int]) -> Model:
    return model.with_sizes({k: v for k, v in sizes.items() if any(e.name == k for e in model.extents)})


def _inputs(model: Model, sizes: dict[str, int], rng: np.random.Generator, draw) -> dict[str, np.ndarray]:
    out = {}
    for t in model.inputs:
        shape = tuple(sizes[e] for e in t.extents)
        if t.is_index:
            assert t.range is not None
            out[t.name] = rng.integers(0, sizes[t.range], size=shape)
            if t.grouped:  # a grouping's values never decrease (GROUPS:)
                out[t.name] = np.sort(out[t.name], axis=None).reshape(shape)
        else:
            out[t.name] = draw(shape)
    return out


def _backward_inputs(bw: Backward, model: Model, x: dict, saved: dict, u: dict) -> dict[str, np.ndarray]:
    cot = dict((c, o) for o, c in bw.cotangents)
    saved_names = {s for _, s in bw.saved}
    out = {}
    for t in model.inputs:
        if t.name in bw.accumulated:
            out[t.name] = np.zeros(tuple(_size(model, e) for e in t.extents))
        elif t.name in cot:
            out[t.name] = u[cot[t.name]]
        elif t.name in saved_names:
            out[t.name] = saved[t.name]
        else:
            out[t.name] = x[t.name]
    return out


def _size(model: Model, extent: str) -> int:
    n = model.extent(extent).size
    assert n is not None
    return n


def adjoint_check(bw: Backward, model: Model, *, trials: int = 2, seed: int = 0,
                  p: int = DEFAULT_PRIME) -> AdjointResult:
    """⟨u, J·v⟩ = ⟨Jᵀ·u, v⟩ over GF(p) for `bw` = derive(`model`), at small sizes."""
    sizes = small_sizes(model)
    fwd, saves, back = _bind(model, sizes), _bind(bw.forward, sizes), _bind(bw.model, sizes)
    wrt = {x for x, _ in bw.gradients}
    for trial in range(trials):
        field = PrimeField(p, seed=seed + trial)
        dual = DualField(field)
        rng = np.random.default_rng([seed, trial])
        x = _inputs(fwd, sizes, rng, lambda s, f=field, r=rng: f.random(r, s))
        v = {n: field.random(rng, a.shape) if n in wrt else np.zeros_like(a) for n, a in x.items()
             if not fwd.tensor(n).is_index}
        packed = {n: (dual.pack(a, v[n]) if n in v else a) for n, a in x.items()}
        out = Evaluator(fwd, bind_inputs(fwd, packed), dual).run(packed)
        saved = evaluate_field(saves, x, field)
        u = {o.name: field.random(rng, np.shape(out[o.name])) for o in fwd.outputs}
        lhs = 0
        for o in fwd.outputs:
            real, jv = dual.split(out[o.name])
            if not np.array_equal(real, saved[o.name]):
                return AdjointResult(False, f"the forward model with saved values computes another {o.name}")
            lhs += int((u[o.name] * jv % p).sum())
        grads = evaluate_field(back, _backward_inputs(bw, back, x, saved, u), field)
        rhs = sum(int((grads[g] * v[n] % p).sum()) for n, g in bw.gradients)
        if lhs % p != rhs % p:
            return AdjointResult(False, f"<u, J v> = {lhs % p} but <J^T u, v> = {rhs % p} over GF({p}) "
                                        f"(trial {trial}, sizes {sizes})")
    return AdjointResult(True, f"<u, J v> = <J^T u, v> over GF({p}) in {trials} trials at sizes {sizes}")


def finite_difference_check(bw: Backward, model: Model, *, seed: int = 0, h: float = 1e-6,
                            rtol: float = 1e-5) -> AdjointResult:
    """⟨u, J·v⟩ by central differences of the float64 reference against ⟨Jᵀ·u, v⟩ from the backward
    model in float64 (inputs of magnitude 0.5 to 1.5 and random sign; index tensors random)."""
    sizes = small_sizes(model)
    fwd, saves, back = _bind(model, sizes), _bind(bw.forward, sizes), _bind(bw.model, sizes)
    rng = np.random.default_rng(seed)

    def draw(shape):
        return rng.uniform(0.5, 1.5, size=shape) * rng.choice([-1.0, 1.0], size=shape)

    x = _inputs(fwd, sizes, rng, draw)
    wrt = {n for n, _ in bw.gradients}
    v = {n: rng.standard_normal(a.shape) for n, a in x.items() if n in wrt}

    def at(step: float) -> dict[str, np.ndarray]:
        moved = {n: a + step * v[n] if n in v else a for n, a in x.items()}
        return evaluate(fwd, moved)

    plus, minus = at(h), at(-h)
    saved = evaluate(saves, x)
    u = {o.name: rng.standard_normal(np.shape(plus[o.name])) for o in fwd.outputs}
    lhs = sum(float((u[o] * (plus[o] - minus[o]) / (2 * h)).sum()) for o in u)
    grads = evaluate(back, _backward_inputs(bw, back, x, saved, u))
    rhs = sum(float((grads[g] * v[n]).sum()) for n, g in bw.gradients)
    if not np.isfinite(rhs) or abs(lhs - rhs) > rtol * max(1.0, abs(lhs), abs(rhs)):
        return AdjointResult(False, f"<u, J v> = {lhs!r} by central differences but <J^T u, v> = {rhs!r}")
    return AdjointResult(True, f"<u, J v> = {lhs:.9g} by central differences, <J^T u, v> = {rhs:.9g}")


def rule_check(fn: str, *, seed: int = 0, points: int = 64, h: float = 1e-6) -> list[str]:
    """Each derivative rule of `fn` against central differences at random points; the failures."""
    f = FUNCTIONS[fn]
    if f.derivative is None:
        return []
    rng = np.random.default_rng(seed)
    positive = fn in ("log", "sqrt", "rsqrt")
    args = [rng.uniform(0.3, 2.0, points) if positive else
            rng.uniform(0.3, 2.0, points) * rng.choice([-1.0, 1.0], points) for _ in range(f.arity)]
    if f.arity == 2:  # keep away from ties (max, min) and from zero divisors
        args[1] = np.where(np.abs(args[0] - args[1]) < 0.1, args[1] + 0.5, args[1])
    domain = Float64()
    failures = []
    for i in range(f.arity):
        moved_up = [a + h if k == i else a for k, a in enumerate(args)]
        moved_down = [a - h if k == i else a for k, a in enumerate(args)]
        numeric = (f.float64(*moved_up) - f.float64(*moved_down)) / (2 * h)
        rule = np.broadcast_to(eval_rule(fn, i, args, domain), numeric.shape)
        bad = ~np.isclose(rule, numeric, rtol=1e-5, atol=1e-7)
        if np.any(bad):
            k = int(np.argmax(bad))
            failures.append(f"d{fn}/d(argument {i}) at {[float(a[k]) for a in args]}: the rule gives "
                            f"{float(rule[k])!r}, central differences {float(numeric[k])!r}")
    return failures


__all__ = ["AdjointResult", "DualField", "adjoint_check", "finite_difference_check", "rule_check", "small_sizes"]
