"""Compositions, colon definitions, element-level words and the composition checker's errors."""

from __future__ import annotations

import numpy as np
import pytest

from habu.spec.reference import evaluate
from tests.conftest import assert_error_format, error_of, parse

DECLS = """
16 EXTENT: #B  1 EXTENT: #ONE  8 EXTENT: #D  12 EXTENT: #H
TENSOR: X ( #B #D )   TENSOR: W1 ( #D #H )  TENSOR: B1 ( #ONE #H )
TENSOR: W2 ( #H #D )  TENSOR: B2 ( #ONE #D )  TENSOR: Y ( #B #D )  TENSOR: Z ( #B #H )
TENSOR: S ( )
"""


def run(body: str, name: str = "T"):
    return parse(DECLS + body).models[name]


def test_parameters_go_to_the_words_in_order():
    m = run("MODEL: T ( x w1 b1 -- z ) LINEAR ;")
    assert [t.name for t in m.inputs] == ["X", "W1", "B1"]
    rng = np.random.default_rng(0)
    x, w, b = rng.standard_normal((16, 8)), rng.standard_normal((8, 12)), rng.standard_normal((1, 12))
    np.testing.assert_allclose(evaluate(m, {"X": x, "W1": w, "B1": b})["Z"], x @ w + b)


def test_all_inputs_on_the_stack_when_no_word_takes_parameters():
    m = run("MODEL: T ( x w1 -- z ) MATMUL ;")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((16, 8)), rng.standard_normal((8, 12))
    np.testing.assert_allclose(evaluate(m, {"X": x, "W1": w})["Z"], x @ w)


def test_stack_shuffles():
    m = run("MODEL: T ( x y -- y ) SWAP DROP DUP ADD ;")
    rng = np.random.default_rng(0)
    y = rng.standard_normal((16, 8))
    np.testing.assert_allclose(evaluate(m, {"X": y * 0, "Y": y} if False else {"Y": y})["Y"], 2 * y)


def test_arithmetic_words_on_tensors_and_constants():
    m = run("MODEL: T ( x -- y ) 2 * 1 + ;")
    x = np.random.default_rng(0).standard_normal((16, 8))
    np.testing.assert_allclose(evaluate(m, {"X": x})["Y"], 2 * x + 1)


def test_element_level_words_build_one_equation():
    program = parse("""
        8 EXTENT: #M  4 EXTENT: #N  5 EXTENT: #K
        TENSOR: A ( #M #K )  TENSOR: B ( #N #K )  TENSOR: O ( #M #N )  ITENSOR: IX ( #M #M )
        : DOT ( ix<#M> ix<#N> -- r )  SWAP IX@ k A@  SWAP k B@ *  k SUM-OVER ;
        MODEL: G ( -- ) m n DOT m n O! ;
        MODEL: E  O[m n] = Σ k A[IX[m] k] · B[n k] ;""")
    g, e = program.models["G"], program.models["E"]
    assert g.canonical_hash() == e.canonical_hash()


@pytest.mark.parametrize("body, fragment", [
    ("MODEL: T ( x -- y ) ADD ;", "stack underflow: ADD takes 2 values, but only 1 is on the stack"),
    ("MODEL: T ( x -- y ) DUP ;", "leaves 2 values on the stack but its signature has 1 output"),
    ("MODEL: T ( x w2 -- y ) MATMUL ;", "extent i is #D in x but #H in w2"),
    ("MODEL: T ( x z -- y ) ADD ;", "extents do not match: #D in x against #H in z"),
    ("MODEL: T ( x w1 -- y ) MATMUL ;", "has extents ( #B #H ) but Y is declared ( #B #D )"),
    ("MODEL: T ( x -- y ) LINEAR ;", "the words of T take 2 parameters but its signature has 1 input"),
    ("MODEL: T ( x q -- y ) ;", "input q is not a declared tensor"),
    ("MODEL: T ( x -- y ) FROB ;", "unknown word FROB"),
    ("MODEL: T ( x -- y ) RMSNORM RMSNORM GELUU ;", "did you mean GELU"),
    ("MODEL: T ( x -- y ) RMSNORM;", "put a space before ;"),
    ("MODEL: T ( x -- y ) RMSNORM", "has no closing ;"),
    ("MODEL: T ( x -- ) RMSNORM ;", "leaves 1 value"),
    ("MODEL: T ( x -- y ) DROP S ;", "has extents (  ) but Y is declared"),
])
def test_composition_errors(body, fragment):
    err = error_of(DECLS + body)
    assert fragment in err.render(), err.render()
    assert_error_format(err)


def test_parameters_leave_nothing_on_the_stack():
    err = error_of(DECLS + "MODEL: T ( x w1 -- z ) LINEAR ;")
    assert "stack underflow: LINEAR takes 1 value, but none are on the stack" in err.message


@pytest.mark.parametrize("body, fragment", [
    (": F ( a -- b ) ADD ;", "stack underflow"),
    (": F ( a b -- c ) ;", "F leaves 2 values but its effect ( a b -- c ) says 1"),
    (": F ( a -- b | w ) ;", "parameter w of F is never used"),
    (": F ( a -- b ) F ;", "unknown word F"),
    (": F ( a b ) ;", "needs -- between"),
    (": F ( -- r ) b ;", "should leave an element value r"),
    (": F ( ix<#B> -- r ) X@ ;", "stack underflow"),
    (": F ( ix<#B> ix<#D> -- r ) SWAP X@ ;", "X@'s index 1 is over #B"),
    ("WORD: F ( x[r i] -- y[r o] ) y[r o] = x[r 0] ;", "extent o of y comes from no input"),
    ("WORD: F ( x[r i] -- y[r] ) y[r] = x[r i] ;", "index i is free"),
    ("WORD: F ( a b -- y c ) a ;", "exactly one output"),
])
def test_definition_errors(body, fragment):
    err = error_of(DECLS + body)
    assert fragment in err.render(), err.render()
    assert_error_format(err)


def test_definitions_bind_early_so_a_redefinition_can_extend_the_old_word():
    m = run(": LINEAR ( x -- y | w b ) LINEAR RELU ;  MODEL: T ( x w1 b1 -- z ) LINEAR ;")
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((16, 8)), rng.standard_normal((8, 12)), rng.standard_normal((1, 12))
    np.testing.assert_allclose(evaluate(m, {"X": x, "W1": w, "B1": b})["Z"], np.maximum(x @ w + b, 0))


def test_user_equation_word_generic_over_extents():
    program = parse(DECLS + "WORD: ROWSUM ( x[r c] -- y[r] ) y[r] = Σ c x[r c] ;"
                    "TENSOR: V ( #B ) TENSOR: U ( #H ) "
                    "MODEL: T ( x -- v ) ROWSUM ;  MODEL: T2 ( w2 -- u ) ROWSUM ;")
    rng = np.random.default_rng(4)
    x, w2 = rng.standard_normal((16, 8)), rng.standard_normal((12, 8))
    np.testing.assert_allclose(evaluate(program.models["T"], {"X": x})["V"], x.sum(1))
    np.testing.assert_allclose(evaluate(program.models["T2"], {"W2": w2})["U"], w2.sum(1))


def test_error_inside_a_word_names_the_use_site():
    err = error_of(DECLS + ": BAD ( x -- y ) W2 MATMUL ;\nMODEL: T ( x -- y ) BAD ;")
    assert "extent i is #D in x but #H in W2" in err.message
    assert any("in BAD, used at t.habu:7:" in n for n in err.notes), err.render()


def test_vector_words_need_vectors_and_divisible_extents():
    err = error_of("10 EXTENT: #N TENSOR: x ( #N ) TENSOR: y ( #N ) : F ( -- ) x g LOAD-V4 y g STORE-V4 ; "
                   "MODEL: T ( -- ) F ;")
    assert "not a multiple of 4" in err.message
    m = parse("?%4 EXTENT: #N TENSOR: x ( #N ) TENSOR: y ( #N ) : F ( -- ) x g LOAD-V4 y g STORE-V4 ; "
              "MODEL: T ( -- ) F ;").models["T"]
    assert any(ob.kind == "divisible" for ob in m.obligations)


def test_read_after_write_is_refused():
    err = error_of("8 EXTENT: #N TENSOR: x ( #N ) TENSOR: y ( #N ) "
                   ": F ( -- ) x g LOAD-V4 y g STORE-V4 y g LOAD-V4 x g STORE-V4 ; MODEL: T ( -- ) F ;")
    assert "read after it is written" in err.message
