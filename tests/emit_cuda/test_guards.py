"""Guards as z3 prints them, evaluated safely; choosing a member of a checked kernel set."""

from __future__ import annotations

import pytest
import z3
from hypothesis import given
from hypothesis import strategies as st

from habu.emit_cuda.arrays import ArgumentError
from habu.emit_cuda.guards import GuardError, KernelSet, eval_guard, parse_guard, z3_div, z3_mod

K, M = z3.Ints("K M")
FORMULAS = [(2 * K) % 16 == 0, z3.And(K % 8 == 0, M >= 4), z3.Or(K / 2 == 3, z3.Not(M < 5)),
            z3.Implies(K > 1, M > 2), K * 2 + 3 <= M - 1, z3.If(K > 3, M, K) == 4, (K - M) / 3 != (K % -5),
            z3.And(K >= 16, K <= 65536, K % 16 == 0, z3.Or(M == 1, M >= 64))]


def _z3_value(f: z3.BoolRef, k: int, m: int) -> bool:
    return z3.is_true(z3.simplify(z3.substitute(f, (K, z3.IntVal(k)), (M, z3.IntVal(m)))))


@pytest.mark.parametrize("formula", FORMULAS, ids=str)
@given(k=st.integers(-100, 100), m=st.integers(-100, 100))
def test_agrees_with_z3(formula, k, m):
    text = str(z3.simplify(formula))
    assert eval_guard(text, {"K": k, "M": m}) == _z3_value(formula, k, m), text


@given(a=st.integers(-1000, 1000), b=st.integers(-50, 50).filter(bool))
def test_integer_division_is_smt_lib(a, b):
    q, r = z3_div(a, b), z3_mod(a, b)
    assert a == b * q + r and 0 <= r < abs(b)
    assert q == z3.simplify(z3.IntVal(a) / z3.IntVal(b)).as_long()


def test_multiline_guard():
    assert eval_guard("And(K%8 == 0,\n    4 <= M)", {"K": 16, "M": 4})
    assert not eval_guard("(2*K)%16 == 0", {"K": 3})
    assert eval_guard("True", {})


@pytest.mark.parametrize("text", ["__import__('os')", "__import__('os').system('true')", "K.__class__", "open('x')",
                                  "[1, 2]", "lambda: 1", "K ** 2", "K if M else 1", "'a' == 'a'", "1.5 < K",
                                  "And(K, x=1)", "getattr(K, 'real')", "(K := 3)", "K[0]", "__builtins__",
                                  "eval('1')", "K @ M", "K << 2", "{K}"])
def test_unsafe_or_foreign_expressions_are_rejected(text):
    with pytest.raises(GuardError):
        eval_guard(text, {"K": 1, "M": 2})


def test_unknown_name_and_bad_syntax():
    with pytest.raises(GuardError, match="not an extent"):
        eval_guard("Q > 1", {"K": 1})
    with pytest.raises(GuardError, match="cannot parse"):
        parse_guard("K >")
    with pytest.raises(GuardError, match="division by zero"):
        eval_guard("K / 0 == 1", {"K": 1})


def test_kernel_set_chooses_the_first_member_that_holds():
    ks = KernelSet([(("(2*K)%16 == 0", "M >= 64"), "tma"), ("K%2 == 0", "vector"), ((), "scalar")])
    assert ks.select({"K": 512, "M": 64}) == "tma"
    assert ks.select({"K": 512, "M": 63}) == "vector"
    assert ks.select({"K": 511, "M": 64}) == "scalar"
    assert ks.index({"K": 511, "M": 64}) == 2 and len(ks) == 3


def test_kernel_set_without_a_match_lists_the_guards():
    ks = KernelSet([("(2*K)%16 == 0", "tma"), ("K%2 == 0", "vector")])
    with pytest.raises(ArgumentError) as exc:
        ks.select({"K": 511})
    assert exc.value.message == ("no kernel in the set accepts these sizes (K=511): member 0 needs (2*K)%16 == 0; "
                                 "member 1 needs K%2 == 0")


def test_kernel_set_rejects_bad_guards_when_built():
    with pytest.raises(GuardError):
        KernelSet([("__import__('os')", "x")])
    with pytest.raises(GuardError):
        KernelSet([])
