"""A finite-field model in which exp is a homomorphism: exp(a + b) = exp(a) · exp(b) exactly.

`PrimeField` (field.py) models exp as an uninterpreted function, so a plan may not rely on any
identity of exp — and the online softmax does: it rescales running sums by exp(m_old − m_new).
Here (Mirage's construction, with strong primes) a value is a pair (x_q, x_p) of residues, x_q in
Z_q and x_p in GF(p), where q is a prime dividing p − 1 and g has order q in GF(p)*:

- + − · / where, conditions, constants and sums act on both components (Z_q × GF(p) is a ring);
  a / 0 is 0 here (a fully masked softmax row has a zero denominator by construction);
- exp(x) is (1, g^(x_q) mod p): its GF(p) part is the homomorphism Z_q → GF(p)*, so
  exp(a + b) = exp(a) · exp(b) and exp(0) = 1 hold exactly there; its Z_q part is 1, the only
  homomorphism (Z_q, +) → (Z_q*, ·) (q − 1 is prime to q). So the Z_q part of anything computed
  from an exp says nothing, and a model whose exp arguments depend on an exp (exp(exp(x)), or
  through an intermediate) is refused (`check_exp_arguments`): check it with `PrimeField`;
- every other function (rsqrt, max, …) is uninterpreted in each component, as in `PrimeField`;
  a max reduction is prod(r − x) in each component and −∞ the residue r − 1 in each.

The Z_q component alone is today's check (GF(q), exp uninterpreted); the GF(p) component checks
the identities of exp. PRIME_P = 2q + 1 is the largest safe prime below 2^31 (so that every
product of two residues fits in int64, as `PrimeField` needs, and the pair packs into one int64 as
x_q · 2^31 + x_p, like `DualField`), q = 1073741789 ≈ 2^30; g is drawn per trial among the
elements of order q (the squares ≠ 1), so that no fixed constant in an exp argument can make
exp(c) equal a fixed ratio by accident (GENERATOR = 4 is one of them).
docs/VERIFY.md states the bound per trial.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from habu.spec.evaluate import EvalError, Evaluator, bind_inputs
from habu.spec.field import PairPacked, PrimeField
from habu.spec.ir import Model, Op, walk

PRIME_Q = 1073741789
PRIME_P = 2 * PRIME_Q + 1  # 2147483579, a safe prime
GENERATOR = 4  # 2², of order q in GF(p)*


class ExpField(PairPacked):  # x_q · 2^31 + x_p
    """Z_q × GF(p) with exp(x) = g^(x_q) in the GF(p) component; one trial's keys from `seed`."""

    def __init__(self, seed: int = 0, p: int = PRIME_P, q: int = PRIME_Q, g: int | None = None):
        if g is None:  # a random element of order q per trial: h² for h ∉ {0, ±1}
            h = 2 + int(np.random.default_rng([seed, 0x9E37]).integers(0, p - 3))
            g = h * h % p
        if (p - 1) % q or pow(g, q, p) != 1 or g % p == 1:
            raise ValueError(f"g = {g} must have order q = {q} in GF({p})*, and q must divide p − 1")
        self.fq = PrimeField(q, seed)
        self.fp = PrimeField(p, seed + 1)  # other keys for the uninterpreted functions of each part
        self.p, self.q, self.g = p, q, g
        self.seed = seed
        self.name = f"Z_{q} × GF({p})"
        self._tables: list[np.ndarray] | None = None  # `_exp_tables`, made at the first exp

    def _both(self, fn, *arrays: np.ndarray) -> np.ndarray:
        parts = [self.split(a) for a in arrays]
        return self.pack(fn(self.fq, [a for a, _ in parts]), fn(self.fp, [b for _, b in parts]))

    # -- the Domain protocol (habu.spec.evaluate)
    def from_input(self, name: str, data: np.ndarray) -> np.ndarray:
        xq, xp = self.split(data)
        if np.size(data) and (np.min(data) < 0 or xq.max() >= self.q or xp.max() >= self.p):
            raise EvalError(f"{name}: inputs of {self.name} are packed pairs (x_q · 2^31 + x_p)")
        return np.asarray(data, dtype=np.int64)

    def random(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return self.pack(self.fq.random(rng, shape), self.fp.random(rng, shape))

    def const(self, value: Fraction) -> np.ndarray:
        return self.pack(self.fq.const(value), self.fp.const(value))

    def neg_inf(self) -> np.ndarray:
        return self.pack(self.fq.neg_inf(), self.fp.neg_inf())

    def op(self, fn: str, args: list[np.ndarray]) -> np.ndarray:
        if fn == "div":
            return self._both(_total_division, *args)
        if fn != "exp":
            return self._both(lambda f, a: f.op(fn, a), *args)
        xq, _ = self.split(args[0])
        return self.pack(np.ones_like(xq), self.exp_part(xq))

    def exp_part(self, xq: np.ndarray) -> np.ndarray:
        """g^(x_q) mod p, elementwise: x_q's bytes looked up in tables of g^(b·256^i) (`_exp_tables`), their
        products mod p. (The set bits one at a time, 30 passes over the array, were a quarter of a softmax's
        proof.)"""
        xq = np.asarray(xq, dtype=np.int64)
        tables = self._exp_tables()
        out = tables[0][xq & 0xFF]
        for i in range(1, len(tables)):
            out = (out * tables[i][(xq >> (8 * i)) & 0xFF]) % self.p
        return out

    def _exp_tables(self) -> list[np.ndarray]:
        """For each byte i of an exponent below q: g^(b·256^i) mod p for b = 0..255."""
        if self._tables is None:
            tables = []
            for i in range(-(-self.q.bit_length() // 8)):
                step = pow(self.g, 256 ** i, self.p)
                row = [1]
                for _b in range(255):
                    row.append(row[-1] * step % self.p)
                tables.append(np.asarray(row, dtype=np.int64))
            self._tables = tables
        return self._tables

    def reduce(self, op: str, data: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return self._both(lambda f, a: f.reduce(op, a[0], axes), data)

    def repeat_sum(self, data: np.ndarray, count: int) -> np.ndarray:
        return self._both(lambda f, a: f.repeat_sum(a[0], count), data)

    def repeat_max(self, data: np.ndarray, count: int) -> np.ndarray:
        return self._both(lambda f, a: f.repeat_max(a[0], count), data)

    def merge(self, op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self._both(lambda f, x: f.merge(op, x[0], x[1]), a, b)

    def contract(self, operands: list[np.ndarray], subscripts: str) -> np.ndarray:
        return self._both(lambda f, a: f.contract(a, subscripts), *operands)

    def scatter_add(self, target: np.ndarray, index: tuple[np.ndarray, ...], values: np.ndarray) -> np.ndarray:
        tq, tp = self.split(target)
        vq, vp = self.split(values)
        return self.pack(self.fq.scatter_add(tq, index, vq), self.fp.scatter_add(tp, index, vp))


def _total_division(f: PrimeField, args: list[np.ndarray]) -> np.ndarray:
    """a / b, and 0 where b = 0: a row whose softmax is fully masked has a zero denominator
    structurally (not with probability 1/p), and a model selects another value for it with where()."""
    a, b = np.broadcast_arrays(*args)
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, f.op("div", [a, safe]))


def uses_exp(model: Model) -> bool:
    """Whether any equation of the model applies exp (the only models this field is for)."""
    return any(isinstance(e, Op) and e.fn == "exp" for eq in model.nodes for e in walk(eq.rhs))


def check_exp_arguments(model: Model) -> None:
    """Raise ValueError where an exp's argument depends on the result of an exp (directly or through
    an intermediate): its Z_q part would be the constant 1 and the check would not see it."""
    from habu.spec.ir import Load

    tainted: set[str] = set()
    for eq in model.nodes:
        def depends(e) -> bool:
            return any((isinstance(x, Op) and x.fn == "exp") or (isinstance(x, Load) and x.tensor in tainted)
                       for x in walk(e))

        for x in walk(eq.rhs):
            if isinstance(x, Op) and x.fn == "exp" and depends(x.args[0]):
                raise ValueError(f"in {eq.target}, an exp's argument depends on an exp: Z_q × GF(p) cannot "
                                 "model it (the uninterpreted-exp field can)")
        if depends(eq.rhs):
            tainted.add(eq.target)


def evaluate_exp_field(model: Model, inputs: dict[str, np.ndarray], field: ExpField,
                       sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """The model's outputs over Z_q × GF(p): inputs are packed pairs (index tensors stay integers)."""
    check_exp_arguments(model)
    bound = bind_inputs(model, inputs, where="field input", fixed=sizes)
    return Evaluator(model, bound, field).run(inputs)


def random_inputs(model: Model, field: ExpField, sizes: dict[str, int], rng: np.random.Generator,
                  index_values: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Random packed pairs for every value input; index tensors from `index_values`, else uniform in
    their range."""
    out: dict[str, np.ndarray] = {}
    for t in model.inputs:
        shape = tuple(sizes[e] for e in t.extents)
        if t.is_index:
            given = (index_values or {}).get(t.name)
            out[t.name] = given if given is not None else rng.integers(0, sizes[t.range], shape)  # type: ignore[index]
        else:
            out[t.name] = field.random(rng, shape)
    return out


def same_over_exp_field(original: Model, rewritten: Model, sizes: dict[str, int], trials: int = 2,
                        seed: int = 0, index_values: dict[str, np.ndarray] | None = None) -> str | None:
    """None when `rewritten` computes every output of `original` over Z_q × GF(p) in `trials`
    trials with independent keys and inputs; otherwise where they first differ."""
    for trial in range(trials):
        field = ExpField(seed=seed + 1000 * trial)
        rng = np.random.default_rng(seed + trial)
        ins = random_inputs(original, field, sizes, rng, index_values)
        extra = random_inputs(rewritten, field, sizes, rng, index_values)
        ins |= {k: v for k, v in extra.items() if k not in ins}
        want = evaluate_exp_field(original, ins, field, sizes)
        got = evaluate_exp_field(rewritten, {t.name: ins[t.name] for t in rewritten.inputs}, field, sizes)
        for name, w in want.items():
            g = got.get(name)
            if g is None:
                return f"{name} is not computed by the rewritten model"
            diff = np.argwhere(np.asarray(g) != np.asarray(w))
            if len(diff):
                at = tuple(int(i) for i in diff[0])
                part = "GF(p)" if field.split(g[at])[1] != field.split(w[at])[1] else "Z_q"
                return f"{name}{list(at)} differs in the {part} component in trial {trial + 1}"
    return None
