"""exp over the field: Z_q × GF(p) with exp(x) = g^(x_q) in GF(p) makes exp(a + b) = exp(a)·exp(b)
exact, and still tells different computations apart."""

from __future__ import annotations

import numpy as np
import pytest

from habu.spec.field import PrimeField, evaluate_field
from habu.spec.field_exp import GENERATOR, PRIME_P, PRIME_Q, ExpField, same_over_exp_field, uses_exp
from habu.spec.parser import parse_text

HEAD = """
6 EXTENT: #R
5 EXTENT: #C
TENSOR: A ( #R #C )
TENSOR: B ( #R #C )
TENSOR: Y ( #R #C )
TENSOR: Z ( #R )
"""


def model(eq: str):
    return next(iter(parse_text(HEAD + eq, "t.habu").models.values()))


SIZES = {"R": 6, "C": 5}


def test_the_primes_are_a_safe_pair_and_g_has_order_q():
    import galois

    assert galois.is_prime(PRIME_P) and galois.is_prime(PRIME_Q) and PRIME_P == 2 * PRIME_Q + 1
    assert PRIME_P < 2**31 and PRIME_Q > 2**29
    assert pow(GENERATOR, PRIME_Q, PRIME_P) == 1 and GENERATOR % PRIME_P != 1


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_exp_part_is_g_to_the_exponent_and_g_has_order_q(seed):
    f = ExpField(seed=seed)
    assert pow(f.g, PRIME_Q, PRIME_P) == 1 and f.g != 1
    xs = np.array([0, 1, 2, 12345, PRIME_Q - 1])
    assert list(f.exp_part(xs)) == [pow(f.g, int(x), PRIME_P) for x in xs]
    xs = np.random.default_rng(seed).integers(0, PRIME_Q, (3, 100))  # every byte of the exponent, any shape
    assert f.exp_part(xs).tolist() == [[pow(f.g, int(x), PRIME_P) for x in row] for row in xs]
    assert ExpField(seed=seed, g=GENERATOR).g == GENERATOR


@pytest.mark.parametrize(("a", "b"), [
    ("Y[r c] = exp(A[r c] + B[r c]) ;", "Y[r c] = exp(A[r c]) · exp(B[r c]) ;"),
    ("Y[r c] = exp(A[r c] − B[r c]) ;", "Y[r c] = exp(A[r c]) / exp(B[r c]) ;"),
    ("Y[r c] = exp(A[r c] − A[r c]) · B[r c] ;", "Y[r c] = B[r c] ;"),
    ("Y[r c] = exp(A[r c] − max c' A[r c']) / Σ c2 exp(A[r c2] − max c3 A[r c3]) ;",
     "Y[r c] = exp(A[r c]) / Σ c2 exp(A[r c2]) ;"),
])
def test_identities_of_exp_hold_exactly(a, b):
    assert same_over_exp_field(model("MODEL: M " + a), model("MODEL: M " + b), SIZES) is None


@pytest.mark.parametrize(("a", "b"), [
    ("Y[r c] = exp(A[r c] + B[r c]) ;", "Y[r c] = exp(A[r c]) + exp(B[r c]) ;"),
    ("Y[r c] = exp(A[r c] + B[r c]) ;", "Y[r c] = exp(A[r c]) · exp(B[r c]) · exp(B[r c]) ;"),
    ("Y[r c] = exp(A[r c]) / Σ c2 exp(A[r c2]) ;", "Y[r c] = exp(A[r c]) / Σ c2 exp(B[r c2]) ;"),
    ("Y[r c] = rsqrt(A[r c] · B[r c]) ;", "Y[r c] = rsqrt(A[r c]) · rsqrt(B[r c]) ;"),
    ("Y[r c] = exp(2 · A[r c]) ;", "Y[r c] = exp(A[r c]) · A[r c] ;"),
])
def test_non_identities_are_told_apart(a, b):
    assert same_over_exp_field(model("MODEL: M " + a), model("MODEL: M " + b), SIZES) is not None


def test_uninterpreted_exp_of_prime_field_is_unchanged():
    """The default field still refuses exp(a + b) = exp(a)·exp(b): models without the need keep it."""
    a, b = model("MODEL: M Y[r c] = exp(A[r c] + B[r c]) ;"), model("MODEL: M Y[r c] = exp(A[r c]) · exp(B[r c]) ;")
    f = PrimeField(seed=1)
    rng = np.random.default_rng(0)
    ins = {"A": f.random(rng, (6, 5)), "B": f.random(rng, (6, 5))}
    assert not np.array_equal(evaluate_field(a, ins, f)["Y"], evaluate_field(b, ins, f)["Y"])
    assert uses_exp(a) and not uses_exp(model("MODEL: M Y[r c] = A[r c] ;"))


def test_each_component_is_its_own_field():
    """Without exp the Z_q part is GF(q) and the GF(p) part is GF(p), evaluated side by side."""
    m = model("MODEL: M Z[r] = Σ c A[r c] · B[r c] / (A[r 0] + 1) + max c' B[r c'] ;")
    f = ExpField(seed=5)
    rng = np.random.default_rng(1)
    ins = {"A": f.random(rng, (6, 5)), "B": f.random(rng, (6, 5))}
    from habu.spec.field_exp import evaluate_exp_field

    zq, zp = f.split(evaluate_exp_field(m, ins, f)["Z"])
    for part, field in ((0, f.fq), (1, f.fp)):
        plain = {k: f.split(v)[part] for k, v in ins.items()}
        np.testing.assert_array_equal((zq, zp)[part], evaluate_field(m, plain, field)["Z"])


def test_regression_exp_of_exp_is_refused_not_proven():
    """The Z_q part of exp is 1, so exp(exp(A)) would look like exp(exp(B)): refused instead."""
    a, b = model("MODEL: M Y[r c] = exp(exp(A[r c])) ;"), model("MODEL: M Y[r c] = exp(exp(B[r c])) ;")
    with pytest.raises(ValueError, match="depends on an exp"):
        same_over_exp_field(a, b, SIZES)


def test_masked_softmax_identity_with_neg_inf():
    """exp(−∞ − m) weighs nothing in float64; over the field the mask is a where, so the masked
    softmax with its max shift equals the unshifted one there too."""
    a = model("MODEL: M Y[r c] = where(c ≤ r, exp(A[r c] − max c' where(c' ≤ r, A[r c'], −∞)), 0) / "
              "Σ c2 where(c2 ≤ r, exp(A[r c2] − max c3 where(c3 ≤ r, A[r c3], −∞)), 0) ;")
    b = model("MODEL: M Y[r c] = where(c ≤ r, exp(A[r c]), 0) / Σ c2 where(c2 ≤ r, exp(A[r c2]), 0) ;")
    assert same_over_exp_field(a, b, SIZES) is None
