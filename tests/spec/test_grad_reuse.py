"""A gradient's term that recomputes a forward output reads it (habu/spec/grad_reuse.py): attention's
`D = Σ j P·dP` becomes `Σ d dO·O` (FlashAttention-2's), a sum's factors found under a one-to-one renaming and
nothing else rewritten; the adjoint check over GF(p) passes on the rewritten backward and fails on a wrong one."""

from __future__ import annotations

import pytest

import habu.spec.grad as grad_module
from habu.spec.equation import format_expr
from habu.spec.grad import derive
from habu.spec.grad_check import adjoint_check
from habu.spec.grad_reuse import MINUS_ONE, read_outputs, signed_factors
from habu.spec.ir import Op, tensors_read
from habu.spec.parser import load_program, parse_text
from tests.conftest import ROOT

TEXT = """4 EXTENT: #I 5 EXTENT: #J 3 EXTENT: #D
f32 TENSOR: A ( #I #D ) f32 TENSOR: V ( #J #D ) f32 TENSOR: P ( #I #J ) f32 TENSOR: Q ( #I #J )
f32 TENSOR: X ( #I #J ) f32 TENSOR: O ( #I #D ) f32 TENSOR: Z ( #I )
f32 TENSOR: S ( #J #J ) f32 TENSOR: T ( #J #J ) f32 TENSOR: U ( #J )
MODEL: NODE       O[i d] = Σ j P[i j] · V[j d] ;
MODEL: HOLDS      Z[i] = Σ j d A[i d] · V[j d] · P[i j] ;
MODEL: NEGATED    Z[i] = Σ j d −(A[i d] · V[j d] · P[i j]) ;
MODEL: LEFT-OVER  Z[i] = Σ j d A[i d] · V[j d] · P[i j] · Q[i j] ;
MODEL: SQUARE     T[j j'] = Σ j2 S[j j2] · S[j2 j'] ;
MODEL: DIAGONAL   U[j] = Σ j2 S[j j2] · S[j2 j] ;
MODEL: NORMALISED O[i d] = Σ j div0(X[i j], Σ j' X[i j']) · V[j d] ;
"""
MODELS = parse_text(TEXT, "reuse.habu").models


def node(name: str):
    return MODELS[name].nodes[0]


def rewritten(term_model: str, output_model: str) -> str:
    return format_expr(read_outputs(node(term_model).rhs, [node(output_model)]))


def test_a_sum_holding_an_outputs_factors_reads_the_output():
    assert rewritten("HOLDS", "NODE") == "Σ d A[i d] · O[i d]"
    assert rewritten("NEGATED", "NODE") == "Σ d −(A[i d] · O[i d])"  # the negation kept as a factor −1
    assert signed_factors(node("NEGATED").rhs.body)[0] == MINUS_ONE


def test_a_factor_left_that_reads_the_summed_variable_keeps_the_sum():
    assert rewritten("LEFT-OVER", "NODE") == format_expr(node("LEFT-OVER").rhs)


def test_the_renaming_is_one_to_one():
    """`Σ j2 S[j j2]·S[j2 j]` is T's diagonal T[j j]: T's j and j' would both go to j. The renaming is one to one, so
    it is left as it is (a read at a repeated index has no gradient rule and no plan)."""
    assert rewritten("DIAGONAL", "SQUARE") == format_expr(node("DIAGONAL").rhs)


def test_attentions_row_sum_gradient_reads_the_forward_output():
    model = load_program(ROOT / "examples" / "attention.habu").models["ATTENTION-GQA"]
    bw = derive(model)
    assert ("O", "O") in bw.saved and [o.name for o in bw.forward.outputs].count("O") == 1
    (ds2,) = [eq for eq in bw.model.nodes if "O" in tensors_read(eq.rhs)]
    assert tensors_read(ds2.rhs) == {"dO", "O"}  # no scores, no dO·V: one pass over I·D elements (its factor
    # −div0(1, R2) moves into dS: habu/spec/grad_cover.py)
    assert "O" in {t.name for t in bw.model.inputs}
    assert adjoint_check(bw, model).passed


def test_a_users_normalised_sum_reads_its_output_and_passes_the_adjoint_check():
    model = MODELS["NORMALISED"]
    bw = derive(model)
    assert ("O", "O") in bw.saved
    assert adjoint_check(bw, model).passed


def test_an_elementwise_output_is_made_again_not_read():
    model = load_program(ROOT / "examples" / "rmsnorm.habu").models["RMSNORM-ROWS"]
    bw = derive(model)
    assert all(t != s for t, s in bw.saved)
    assert "Y" not in {t.name for t in bw.model.inputs}


def test_mutant_a_reuse_that_drops_the_sign_fails_the_adjoint_check(monkeypatch: pytest.MonkeyPatch):
    """The adjoint check over GF(p) is what makes the rewrite safe: a reuse that loses the term's −1 is caught."""

    def wrong(term, outputs):
        got = read_outputs(term, outputs)
        if got == term:
            return got

        def strip(e):
            if isinstance(e, Op) and e.fn == "neg":
                return strip(e.args[0])
            if isinstance(e, Op):
                return Op(e.fn, tuple(strip(a) for a in e.args))
            return e

        return type(got)(got.op, got.vars, strip(got.body)) if hasattr(got, "vars") else strip(got)

    model = load_program(ROOT / "examples" / "attention.habu").models["ATTENTION-GQA"]
    monkeypatch.setattr(grad_module, "read_outputs", wrong)
    assert not adjoint_check(derive(model), model).passed
