"""The equation form: typing by extent, reductions, gathers, functions, precedence."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from habu.spec.equation import format_equation
from habu.spec.ir import Const, Gather, IndexVar, Load, Op, Reduce
from habu.spec.reference import evaluate
from tests.conftest import assert_error_format, error_of, parse, where

DECLS = """
128 EXTENT: #M
 64 EXTENT: #N
 32 EXTENT: #K
TENSOR: A ( #M #K )
TENSOR: B ( #N #K )
TENSOR: O ( #M #N )
TENSOR: V ( #M )
TENSOR: S ( )
ITENSOR: IX ( #M #M )
"""


def model(eq: str):
    program = parse(DECLS + f"MODEL: T {eq} ;\n")
    return program.models["T"]


def test_gathered_gemm_ir():
    m = model("O[m n] = Σ k A[ IX[m] k ] · B[n k]")
    (eq,) = m.nodes
    assert eq.target == "O" and [v.name for v in eq.lhs] == ["m", "n"]
    assert isinstance(eq.rhs, Reduce) and eq.rhs.op == "sum"
    prod = eq.rhs.body
    assert isinstance(prod, Op) and prod.fn == "mul"
    a, b = prod.args
    assert a == Load("A", (Gather("IX", (IndexVar("m", "M"),)), IndexVar("k", "K")))
    assert b == Load("B", (IndexVar("n", "N"), IndexVar("k", "K")))


def test_swapped_indices_fail_naming_both_extents():
    err = error_of(DECLS + "MODEL: T O[m n] = Σ k A[k m] · B[n k] ;\n")
    assert "#M" in err.message and "#K" in err.message
    assert "A's index 1" in err.message
    assert where(err) == (11, 25)  # the k in A[k m]
    assert_error_format(err)


def test_ascii_sum_and_star_mean_the_same():
    a = model("O[m n] = Σ k A[m k] · B[n k]")
    b = model("O[m n] = sum k A[m k] * B[n k]")
    assert a.nodes == b.nodes
    assert a.canonical_hash() == b.canonical_hash()


def test_sum_over_two_indices_and_max_reduction():
    m = model("S = Σ m k A[m k] · A[m k]")
    assert isinstance(m.nodes[0].rhs, Reduce) and len(m.nodes[0].rhs.vars) == 2
    m = model("V[m] = max k A[m k]")
    assert m.nodes[0].rhs.op == "max"


def test_precedence_and_constants():
    m = model("O[m n] = 2 + 3 · A[m 0] - B[n 0] / 4")
    assert format_equation(m.nodes[0]) == "O[m n] = 2 + 3 · A[m 0] − B[n 0] / 4"
    rhs = m.nodes[0].rhs
    assert isinstance(rhs, Op) and rhs.fn == "sub"
    assert rhs.args[0] == Op("add", (Const(Fraction(2)), Op("mul", (Const(Fraction(3)), rhs.args[0].args[1].args[1]))))


def test_reduction_body_is_a_product_chain():
    m = model("V[m] = Σ k A[m k] · 2 + 1")
    rhs = m.nodes[0].rhs
    assert isinstance(rhs, Op) and rhs.fn == "add"  # (Σ k A·2) + 1
    assert isinstance(rhs.args[0], Reduce)


def test_functions_powers_and_extent_sizes():
    m = model("V[m] = rsqrt(Σ k A[m k]² / #K + 0.000001) · exp(-V[m]) · max(V[m], 0) · tanh(V[m])^2")
    text = format_equation(m.nodes[0])
    assert "rsqrt" in text and "#K" in text and "max(" in text and "exp(" in text


@pytest.mark.parametrize("eq, fragment", [
    ("O[m n] = Σ k A[m k] · C[n k]", "unknown tensor C"),
    ("O[m n] = Σ k A[m k] · B[n k] · A[m q]", "not an index variable"),
    ("O[m n] = A[m k]", "index k is free"),
    ("O[m n] = Σ k Σ k A[m k]", "already bound"),
    ("O[m] = 1", "O has 2 extents"),
    ("O[m m] = 1", "appears twice"),
    ("O[m n] = A[m]", "A has 2 extents"),
    ("O[m n] = exp(A[m 0], 2)", "exp takes 1 argument"),
    ("O[m n] = frob(A[m 0])", "unknown function frob"),
    ("O[m n] = Σ A[m 0]", "needs the index variables"),
    ("O[m n] = A[m 0] +", "ends too early"),
    ("O[m n] = (A[m 0]", "expected ')'"),
    ("O[m n] = A[IX k]", "IX used as an index without"),
    ("O[m n] = A[A[m 0] 0]", "not an index tensor"),
    ("O[m n] = IX[m]", "is an index tensor"),
    ("IX[m] = 1", "index tensor; an equation cannot define it"),
    ("O[m n] = A[m 40]", "constant index 40"),
    ("O[m n] = A[m 0] ^ 99", "whole exponent"),
    ("O[m n] = 1e99", "too large"),
    ("O[m n] = A[m 0] $", "unexpected character"),
    ("O[m n] = k", "cannot be used as a number"),
    ("O[m n] A[m 0]", "expected '='"),
    ("O[m n] = A[m 0] B[n 0]", "expected an operator"),
    ("O[m n] = A[IX[n] 0]", "IX's index 1 is over #M, but n ranges over #N"),
])
def test_equation_errors(eq, fragment):
    err = error_of(DECLS + f"MODEL: T {eq} ;\n")
    assert fragment in err.message, err.render()
    assert_error_format(err)


def test_index_variable_suffixes_name_the_same_extent():
    m = model("V[m] = Σ k k' k2 A[m k] · A[m k'] · A[m k2]")
    assert {v.extent for v in m.nodes[0].rhs.vars} == {"K"}


def test_gather_through_gather_evaluates():
    program = parse("""
        8 EXTENT: #M  4 EXTENT: #K
        TENSOR: A ( #M #K )  TENSOR: O ( #M #K )
        ITENSOR: P ( #M #M )  ITENSOR: Q ( #M #M )
        MODEL: G O[m k] = A[P[Q[m]] k] ;""")
    rng = np.random.default_rng(0)
    a, p, q = rng.standard_normal((8, 4)), rng.permutation(8), rng.integers(0, 8, 8)
    out = evaluate(program.models["G"], {"A": a, "P": p, "Q": q})["O"]
    np.testing.assert_array_equal(out, a[p[q]])


def test_a_left_side_index_not_named_after_an_extent_gets_a_name_that_would_do():
    """`O ( #M #M )` indexed `O[m n]` with no #N declared: the note says how index variables are
    named and offers one for that position."""
    decls = "128 EXTENT: #M\n32 EXTENT: #K\nTENSOR: A ( #M #K )\nTENSOR: G ( #M #M )\n"
    err = error_of(decls + "MODEL: T G[m n] = Σ k A[m k] · A[n k] ;\n")
    assert "'n' is not an index variable" in err.message
    assert "index 2 of G is over #M, so m' or m2 would do" in err.render()
    assert_error_format(err)
    first = error_of(decls + "MODEL: T G[x m] = 1 ;\n")
    assert "index 1 of G is over #M, so m would do" in first.render()


@pytest.mark.parametrize("equation", ["O[m] = X[²]", "O[m] = X[m]^²"])
def test_regression_a_superscript_two_as_an_index_or_exponent_was_a_traceback(equation):
    """`'²'.isdigit()` is True in Python, so `X[²]` reached `int('²')` and raised ValueError (found by
    the fuzz test); it is an error at the ² now."""
    from habu.errors import HabuError
    from habu.spec.parser import parse_text

    text = f"8 EXTENT: #M\nf32 TENSOR: X ( #M )  f32 TENSOR: O ( #M )\nMODEL: SQ  {equation} ;\n"
    with pytest.raises(HabuError) as info:
        parse_text(text, "sq.habu")
    assert info.value.render().startswith("sq.habu:3:")
