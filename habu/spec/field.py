"""The semantics of a model over the prime field GF(p), for the finite-field verifier.

Values are int64 arrays of residues in [0, p). With p = 2^31 − 1 (the default; any prime below
2^31 works) a product of two residues fits in int64, and contractions run exactly in float64 BLAS
by splitting each residue into 16-bit limbs.

What each operation means here (see `habu.spec.functions` and docs/VERIFY.md):
- + − · are the field operations; a / b is a · b⁻¹ (b ≡ 0 is reported, with probability ≈ 1/p);
- constants are exact rationals mapped into the field; #D is the extent's size;
- exp, rsqrt, sqrt, tanh, erf, sigmoid, log, abs are uninterpreted: keyed pseudo-random functions
  (splitmix64 of the residue and a per-trial, per-function key); max and min are symmetric
  keyed functions of their two arguments;
- a sum reduction is the field sum; a max reduction is prod(r − x) with a fresh r per trial,
  which depends only on the multiset reduced and splits into partial products;
- a condition on indices (`j ≤ i`) is exactly 0 or 1 and `where(c, x, y)` selects; −∞ is the residue
  r − 1, whose factor r − (r − 1) = 1 leaves a max reduction unchanged (the identity of max).
"""

from __future__ import annotations

import hashlib
from fractions import Fraction
from functools import lru_cache

import numpy as np

from habu.spec.evaluate import EvalError, Evaluator, bind_inputs
from habu.spec.functions import FUNCTIONS
from habu.spec.ir import Model

DEFAULT_PRIME = 2**31 - 1
_LIMB = 16
_EXACT_TERMS = 2**19  # sums of this many (17-bit × 17-bit) limb products stay below 2^53


@lru_cache(maxsize=8)
def check_prime(p: int) -> int:
    """p, after galois has confirmed that it is prime."""
    import galois

    if not galois.is_prime(p):
        raise ValueError(f"{p} is not prime")
    return p


def power_mod(base: np.ndarray, exponent: int, p: int) -> np.ndarray:
    """base^exponent mod p, elementwise (p < 2^31, so every product fits in int64)."""
    result = np.ones_like(base, dtype=np.int64)
    b = np.asarray(base, dtype=np.int64) % p
    e = exponent
    while e:
        if e & 1:
            result = (result * b) % p
        b = (b * b) % p
        e >>= 1
    return result


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x += np.uint64(0x9E3779B97F4A7C15)
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _key(seed: int, name: str) -> np.uint64:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return np.uint64(int.from_bytes(digest[:8], "little"))


class PairPacked:
    """A domain whose values are pairs of field elements (each below 2^31), x·2^31 + y in one int64, so
    that the evaluator's indexing, broadcasting and transposing work unchanged (dual numbers, exp's
    Z_q × GF(p))."""

    SHIFT = 31
    MASK = (1 << SHIFT) - 1

    @staticmethod
    def pack(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x, y = np.broadcast_arrays(np.asarray(x, dtype=np.int64), np.asarray(y, dtype=np.int64))
        return (x << PairPacked.SHIFT) | y

    @staticmethod
    def split(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        v = np.asarray(v, dtype=np.int64)
        return v >> PairPacked.SHIFT, v & PairPacked.MASK


class PrimeField:
    """GF(p) arithmetic for one trial: the keys of the uninterpreted functions come from `seed`."""

    def __init__(self, p: int = DEFAULT_PRIME, seed: int = 0):
        if p >= 2**31:
            raise ValueError("the prime must be below 2^31 so that products fit in int64")
        self.p = p
        self.seed = seed
        self.name = f"GF({p})"
        check_prime(p)
        self.max_point = int(_key(seed, "max-reduction-point")) % p

    # -- conversions
    def from_input(self, name: str, data: np.ndarray) -> np.ndarray:
        arr = np.asarray(data, dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() >= self.p):
            raise EvalError(f"{name}: field inputs must be residues in 0..{self.p - 1}")
        return arr

    def const(self, value: Fraction) -> np.ndarray:
        num = value.numerator % self.p
        den = value.denominator % self.p
        if den == 0:
            raise EvalError(f"the constant {value} has no value in GF({self.p})")
        return np.asarray(num * pow(den, -1, self.p) % self.p, dtype=np.int64)

    def random(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        return rng.integers(0, self.p, size=shape, dtype=np.int64)

    # -- elementwise
    def inverse(self, b: np.ndarray) -> np.ndarray:
        if np.any(b == 0):
            raise EvalError(f"division by zero in GF({self.p}) (probability about 1/p per division; "
                            "rerun with another seed)")
        # Fermat: b^(p-2). (galois' GF(p) arrays do this too, but building the field JIT-compiles
        # for about 3 s per process, too slow inside a search loop: measured 2026-11-30, 2-core CPU.)
        return power_mod(b, self.p - 2, self.p)

    def op(self, fn: str, args: list[np.ndarray]) -> np.ndarray:
        p = self.p
        f = FUNCTIONS[fn]
        if f.field == "add":
            return (args[0] + args[1]) % p
        if f.field == "sub":
            return (args[0] - args[1]) % p
        if f.field == "mul":
            return (args[0] * args[1]) % p
        if f.field == "neg":
            return (-args[0]) % p
        if f.field == "div":
            a, b = np.broadcast_arrays(args[0], args[1])
            return (a * self.inverse(np.asarray(b))) % p
        if f.field == "div0":  # total: 0 where the divisor is 0 (a fully masked softmax row)
            a, b = np.broadcast_arrays(args[0], args[1])
            b = np.asarray(b)
            return np.where(b == 0, 0, (a * self.inverse(np.where(b == 0, 1, b))) % p)
        if f.field == "where":
            return np.where(np.asarray(args[0]) != 0, args[1], args[2])
        return self.oracle(fn, args)

    def neg_inf(self) -> np.ndarray:
        """−∞: the residue x with r − x = 1 for the max-reduction point r, so that it leaves the
        product prod(r − x) of a max reduction unchanged (the identity of max, as in float64)."""
        return np.asarray((self.max_point - 1) % self.p, dtype=np.int64)

    def oracle(self, fn: str, args: list[np.ndarray]) -> np.ndarray:
        key = _key(self.seed, fn)
        if len(args) == 1:
            h = _mix(args[0].astype(np.uint64) ^ key)
        else:
            # max and min are symmetric: order the pair by residue first
            a, b = np.broadcast_arrays(*args)
            lo, hi = np.minimum(a, b), np.maximum(a, b)
            with np.errstate(over="ignore"):
                h = _mix(_mix(lo.astype(np.uint64) ^ key) + hi.astype(np.uint64))
        return (h % np.uint64(self.p)).astype(np.int64)

    # -- reductions
    def reduce(self, op: str, data: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        if op == "sum":
            out = data
            for ax in sorted(axes, reverse=True):
                out = self.sum_axis(out, ax)
            return out
        moved = np.moveaxis(data, axes, tuple(range(data.ndim - len(axes), data.ndim)))
        flat = moved.reshape(*moved.shape[: data.ndim - len(axes)], -1)
        return self.product_last((self.max_point - flat) % self.p)

    def sum_axis(self, data: np.ndarray, axis: int) -> np.ndarray:
        n = data.shape[axis]
        if n < 2**32:
            return data.sum(axis=axis) % self.p
        chunks = [np.take(data, range(i, min(n, i + 2**31)), axis=axis).sum(axis=axis) % self.p
                  for i in range(0, n, 2**31)]
        return np.sum(chunks, axis=0) % self.p

    def product_last(self, x: np.ndarray) -> np.ndarray:
        """The product mod p along the last axis, as a tree of pairwise products."""
        p = self.p
        while x.shape[-1] > 1:
            if x.shape[-1] % 2:
                x = np.concatenate([x, np.ones_like(x[..., :1])], axis=-1)
            x = (x[..., 0::2] * x[..., 1::2]) % p
        return x[..., 0]

    def repeat_sum(self, data: np.ndarray, count: int) -> np.ndarray:
        return (data * (count % self.p)) % self.p

    def merge(self, op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """The reduction `op` over the points of two disjoint parts, from each part's reduction: partial sums add;
        a max's partial products Π (r − x) multiply (a max of maxes would not be the max: the model of max is the
        product over all its points)."""
        return (a + b) % self.p if op == "sum" else (a * b) % self.p

    def repeat_max(self, data: np.ndarray, count: int) -> np.ndarray:
        # prod(r − x) over `count` copies of x: (r − x)^count
        out = np.ones_like(data)
        base = (self.max_point - data) % self.p
        e = count
        while e:
            if e & 1:
                out = (out * base) % self.p
            base = (base * base) % self.p
            e >>= 1
        return out

    def scatter_add(self, target: np.ndarray, index: tuple[np.ndarray, ...], values: np.ndarray) -> np.ndarray:
        """`target` with `values` added at `index` mod p (repeated indices add every value; residues
        below 2^31, so fewer than 2^32 additions to one element stay inside int64)."""
        out = np.asarray(target, dtype=np.int64).copy()
        np.add.at(out, index, np.asarray(values, dtype=np.int64))
        return out % self.p

    # -- contractions
    def contract(self, operands: list[np.ndarray], subscripts: str) -> np.ndarray:
        ins_text, out = subscripts.split("->")
        ins = ins_text.split(",")
        ops = list(operands)
        while len(ops) > 2:  # pairwise, the smallest product first, each summing what nothing later reads
            i, j, kept = _next_pair(ops, ins, out)
            prod = self.contract2(ops[i], ops[j], ins[i], ins[j], kept)
            ops = [prod, *(x for n, x in enumerate(ops) if n not in (i, j))]
            ins = [kept, *(x for n, x in enumerate(ins) if n not in (i, j))]
        if len(ops) == 1:
            return self.reduce("sum", ops[0], tuple(i for i, c in enumerate(ins[0]) if c not in out)) \
                if any(c not in out for c in ins[0]) else ops[0]
        return self.contract2(ops[0], ops[1], ins[0], ins[1], out)

    def contract2(self, a: np.ndarray, b: np.ndarray, ia: str, ib: str, out: str) -> np.ndarray:
        sizes = dict(zip(ia, a.shape, strict=True)) | dict(zip(ib, b.shape, strict=True))
        summed = [c for c in dict.fromkeys(ia + ib) if c not in out]
        terms = 1
        for c in summed:
            terms *= sizes[c]
        thin = _thin_side(a, b, ia, ib, out)
        limit = _THIN_TERMS if thin is not None else _EXACT_TERMS
        if terms > limit:
            # split the longest summed axis so that each partial contraction stays exact
            c = max(summed, key=lambda s: sizes[s])
            step = max(1, limit // (terms // sizes[c]))
            total = None
            for lo in range(0, sizes[c], step):
                sa = _slice_axis(a, ia, c, lo, lo + step)
                sb = _slice_axis(b, ib, c, lo, lo + step)
                part = self.contract2(sa, sb, ia, ib, out)
                total = part if total is None else (total + part) % self.p
            assert total is not None
            return total
        if thin is not None:
            return self._thin_contract2(a, b, ia, ib, out, thin)
        mask = (1 << _LIMB) - 1
        a_lo, a_hi = (a & mask).astype(np.float64), (a >> _LIMB).astype(np.float64)
        b_lo, b_hi = (b & mask).astype(np.float64), (b >> _LIMB).astype(np.float64)
        subs = f"{ia},{ib}->{out}"
        batched = len(ia) == 3 and len(ib) == 3 and ia[0] == ib[0] and ia[2] == ib[2] and \
            out == ia[0] + ia[1] + ib[1]

        def exact(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            # "xmk,xnk->xmn" is a stack of matrix products: BLAS through matmul
            r = np.matmul(x, np.swapaxes(y, -1, -2)) if batched else np.einsum(subs, x, y, optimize=True)
            return np.rint(r).astype(np.int64)

        # Karatsuba on 16-bit limbs: three exact float64 products instead of four
        p = self.p
        ll = exact(a_lo, b_lo)
        hh = exact(a_hi, b_hi)
        mid = exact(a_lo + a_hi, b_lo + b_hi) - ll - hh
        s16 = (1 << _LIMB) % p
        s32 = (1 << (2 * _LIMB)) % p
        return (ll % p + (mid % p) * s16 % p + (hh % p) * s32 % p) % p


    def _thin_contract2(self, a: np.ndarray, b: np.ndarray, ia: str, ib: str, out: str, thin: int) -> np.ndarray:
        """The contraction where one operand is thin (a few routed rows against a whole weight matrix): the thin
        one in its four bytes, stacked as one more axis, against the other converted to float64 once; each
        byte's products stay below 2^8 · 2^31 and a sum of at most `_THIN_TERMS` of them below 2^53, so one
        float64 product is exact. The Karatsuba path converts the wide operand into three limb arrays."""
        small, wide, i_small, i_wide = (a, b, ia, ib) if thin == 0 else (b, a, ib, ia)
        small = np.asarray(small, dtype=np.int64)
        limbs = np.stack([((small >> (8 * i)) & 0xFF) for i in range(4)]).astype(np.float64)
        z = next(ch for ch in "zyxwvutsrq" if ch not in ia + ib + out)
        subs = f"{z}{i_small},{i_wide}->{z}{out}"
        r = np.rint(np.einsum(subs, limbs, np.asarray(wide, dtype=np.float64), optimize=True)).astype(np.int64)
        p = self.p
        total = r[0] % p
        for i in range(1, 4):
            total = (total + (r[i] % p) * ((1 << (8 * i)) % p)) % p
        return total


_THIN_TERMS = 2**14  # sums of this many (8-bit × 31-bit) products stay below 2^53
_THIN_ROWS = 64  # an operand is thin where its free elements (those not summed) are at most this many


def _next_pair(ops: list[np.ndarray], ins: list[str], out: str) -> tuple[int, int, str]:
    """The two operands of a contraction of several to contract first, and the labels their product keeps (those
    of the output or of another operand; the rest are summed there): the pair whose product has the fewest
    elements. (The product of every operand at once, before any sum, held #B·#H·#I·#J·#E elements for attention's
    scores `Σ e Q·K·scale`: 47 of a 57-second proof at `--shape I=500,J=1024`.)"""
    sizes = {c: n for x, labels in zip(ops, ins, strict=True) for c, n in zip(labels, x.shape, strict=True)}
    best: tuple[int, int, int, str] | None = None
    for i in range(len(ops)):
        for j in range(i + 1, len(ops)):
            rest = "".join(x for n, x in enumerate(ins) if n not in (i, j)) + out
            kept = "".join(c for c in dict.fromkeys(ins[i] + ins[j]) if c in rest)
            elements = int(np.prod([sizes[c] for c in kept], dtype=np.float64))
            if best is None or elements < best[0]:
                best = (elements, i, j, kept)
    assert best is not None
    return best[1], best[2], best[3]


def _thin_side(a: np.ndarray, b: np.ndarray, ia: str, ib: str, out: str) -> int | None:
    """0 or 1: the operand whose free elements (its axes kept in `out`) number at most `_THIN_ROWS` while the
    other's are many more; None where neither is."""
    def free(x: np.ndarray, labels: str) -> int:
        return int(np.prod([n for c, n in zip(labels, x.shape, strict=True) if c in out], dtype=np.int64))

    fa, fb = free(a, ia), free(b, ib)
    if fa <= _THIN_ROWS and fb >= 16 * fa:
        return 0
    if fb <= _THIN_ROWS and fa >= 16 * fb:
        return 1
    return None


def _slice_axis(x: np.ndarray, labels: str, c: str, lo: int, hi: int) -> np.ndarray:
    if c not in labels:
        return x
    k = labels.index(c)
    idx = [slice(None)] * x.ndim
    idx[k] = slice(lo, hi)
    return x[tuple(idx)]


def evaluate_field(model: Model, inputs: dict[str, np.ndarray], field: PrimeField,
                   sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """The model's outputs over GF(p): inputs are residues (index tensors stay integers)."""
    bound = bind_inputs(model, inputs, where="field input", fixed=sizes)
    return Evaluator(model, bound, field).run(inputs)
