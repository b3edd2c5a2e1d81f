"""C expressions: the lowering's arithmetic over CExpr prints the kernel's, comparisons included."""

from __future__ import annotations

import pytest

from habu.emit_cuda.cexpr import CExpr, bare, c


def test_regression_equality_on_a_c_expression_printed_a_python_bool():
    """`x == 0` on a CExpr took Python's identity comparison: False, printed `false` into the kernel (the
    attention merge guarded its one use by hand). Now it is the C comparison, like z3's terms."""
    x = CExpr("lane")
    assert c(x == 0) == "(lane == 0)"
    assert c(x != 3) == "(lane != 3)"
    assert c(x > 1) == "(lane > 1)" and c(x >= 1) == "(lane >= 1)"
    assert bare((x % 4) == 0) == "(lane % 4) == 0"


def test_a_c_expression_has_no_python_truth_value():
    x = CExpr("kt")
    with pytest.raises(TypeError, match="no Python truth value"):
        if x == 0:
            pass
    with pytest.raises(TypeError, match="no Python truth value"):
        bool(x < 4)
    with pytest.raises(TypeError):
        {x: 1}  # noqa: B018  (== builds an expression: a CExpr is no dict key)


def test_identities_still_simplify_on_ints_only():
    x = CExpr("i")
    assert c(0 * x) == "0" and c(x * 0) == "0" and c(1 * x) == "i" and c(0 + x) == "i" and c(x + 0) == "i"
    assert c(x * CExpr("j")) == "(i * j)"  # a CExpr factor is never taken for 0 or 1
    assert c(CExpr("j") + x) == "(j + i)"
