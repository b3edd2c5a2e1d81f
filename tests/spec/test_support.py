"""Where a model's nodes are zero (habu/spec/support.py): the conditions the k windows of products read."""

from __future__ import annotations

from habu.spec.grad_program import derive_model
from habu.spec.ir import Compare, IndexAffine, IndexVar
from habu.spec.parser import load_program, parse_text
from habu.spec.support import position, supports
from tests.conftest import ROOT


def _causal(extents: tuple[str, str]) -> Compare:
    """`#pos(last) ≤ #pos(last − 1) + #J − #I` over positions 3 (i) and 4 (j) of a 5-position tensor."""
    i, j = position(3, extents[0]), position(4, extents[1])
    return Compare("le", IndexAffine(((1, j),)), IndexAffine(((1, i),), ((1, "J"), (-1, "I"))))


def test_attention_backwards_p_and_ds_are_zero_above_the_causal_diagonal():
    bw = derive_model(load_program(ROOT / "examples" / "attention.habu"), "ATTENTION-GQA")
    found = supports(bw.model)
    assert found["%h2"] == frozenset({_causal(("I", "J"))})  # P = div0(where(mask, exp(…), 0), R2)
    assert found["%h1"] == frozenset({_causal(("I", "J"))})  # dS = P·s·dP − P·D·s: both terms carry P
    assert set(found) == {"%h1", "%h2"}  # the exp (−∞ masked, not 0) and the gradients have none


def _model(body: str):
    text = f"""  8 EXTENT: #M
  8 EXTENT: #N
  8 EXTENT: #K
f32 TENSOR: A ( #M #N )
f32 TENSOR: W ( #N #M )
f32 TENSOR: X ( #M #K )
f32 TENSOR: V ( #N #K )
f32 TENSOR: Y ( #M #N )
MODEL: T  {body} ;
"""
    return parse_text(text).models["T"]


def test_a_sum_is_zero_only_where_both_terms_are():
    assert supports(_model("Y[m n] = where(n ≤ m, A[m n], 0) + where(n ≤ m, W[n m], 0)"))["Y"]
    assert "Y" not in supports(_model("Y[m n] = where(n ≤ m, A[m n], 0) + W[n m]"))


def test_a_product_is_zero_where_either_factor_is_and_div0_where_its_numerator_is():
    m, n = position(0, "M"), position(1, "N")
    below = Compare("le", IndexAffine(((1, n),)), IndexAffine(((1, m),)))
    assert supports(_model("Y[m n] = A[m n] · where(n ≤ m, W[n m], 0)"))["Y"] == frozenset({below})
    assert supports(_model("Y[m n] = div0(where(n ≤ m, A[m n], 0), W[n m])"))["Y"] == frozenset({below})
    assert "Y" not in supports(_model("Y[m n] = div0(A[m n], where(n ≤ m, W[n m], 0))"))  # div0(a, 0) is 0, not a


def test_minus_infinity_and_other_functions_give_no_support():
    assert "Y" not in supports(_model("Y[m n] = where(n ≤ m, A[m n], −∞)"))
    assert "Y" not in supports(_model("Y[m n] = exp(where(n ≤ m, A[m n], 0))"))  # exp(0) = 1


def test_a_sum_keeps_the_conditions_that_do_not_read_its_bound_variables():
    m, n = position(0, "M"), position(1, "N")
    below = Compare("le", IndexAffine(((1, n),)), IndexAffine(((1, m),)))
    assert supports(_model("Y[m n] = Σ k where(n ≤ m, X[m k], 0) · V[n k]"))["Y"] == frozenset({below})
    assert "Y" not in supports(_model("Y[m n] = Σ k where(k ≤ m, X[m k], 0) · V[n k]"))
    assert "Y" not in supports(_model("Y[m n] = max k where(n ≤ m, X[m k], 0) · V[n k]"))  # a max of zeros: not kept


def test_a_load_carries_its_nodes_support_to_the_reader():
    program = load_program(ROOT / "tests" / "data" / "causal_chain.habu")
    from habu.plan.rewrite import apply_rewrites

    model = apply_rewrites(program.models["CAUSAL-CHAIN"], ("split:%1",))
    found = supports(model)
    assert "%1" in found and "Y" not in found  # Y = Σ n P·C: the condition reads the summed n
    assert isinstance(next(iter(found["%1"])).left.terms[0][1], IndexVar)
