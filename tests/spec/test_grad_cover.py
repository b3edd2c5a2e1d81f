"""A backward node's term that multiplies an elementwise node's factors reads that node (habu/spec/grad_cover.py):
attention's dS becomes FlashAttention-2's `P·s·dP − P·D·s`, reading P and D where it read the scores' exp, R2
and `%ds2`; the derived backward passes the adjoint check and finite differences, a wrong normalisation fails the
adjoint check, and a node that would read one tensor more (the MoE backward's `%dgate`) is left as it was."""

from __future__ import annotations

import pytest

import habu.spec.grad_cover as grad_cover
from habu.spec.equation import format_expr
from habu.spec.grad import derive
from habu.spec.grad_check import adjoint_check, finite_difference_check
from habu.spec.grad_cover import normal_factors
from habu.spec.grad_reuse import MINUS_ONE
from habu.spec.ir import Reduce, tensors_read, walk
from habu.spec.parser import load_program, parse_text
from tests.conftest import ROOT

ATTENTION = load_program(ROOT / "examples" / "attention.habu").models["ATTENTION-GQA"]


def _ds_and_p(bw):
    nodes = list(bw.model.nodes)
    dq = next(eq for eq in nodes if eq.target == "dQ")
    ds = next(eq for eq in nodes if eq.target in tensors_read(dq.rhs) and eq.target != "K")
    p = next(eq for eq in nodes if eq.target in tensors_read(ds.rhs) and not any(isinstance(x, Reduce)
                                                                                for x in walk(eq.rhs)))
    return nodes, ds, p


def test_attentions_ds_reads_p_and_d():
    bw = derive(ATTENTION)
    nodes, ds, p = _ds_and_p(bw)
    assert "div0(where(" in format_expr(p.rhs)  # P = div0(where(mask, exp(…), 0), R2)
    (d,) = [eq for eq in nodes if tensors_read(eq.rhs) == {"dO", "O"}]
    assert tensors_read(ds.rhs) == {p.target, d.target, "dO", "V"}  # not the exp, R2 or %ds2
    assert nodes.index(p) < nodes.index(ds) and nodes.index(d) < nodes.index(ds)
    exp = next(t for t in tensors_read(p.rhs) if t.startswith("%"))
    assert [eq.target for eq in nodes if exp in tensors_read(eq.rhs)] == [p.target]  # P is the exp's one reader
    assert adjoint_check(bw, ATTENTION).passed
    assert finite_difference_check(bw, ATTENTION).passed


def test_normal_factors_read_div0_and_a_zero_selection_as_products():
    model = parse_text("""4 EXTENT: #I 5 EXTENT: #J
f32 TENSOR: A ( #I #J ) f32 TENSOR: B ( #I ) f32 TENSOR: Y ( #I #J )
MODEL: M  Y[i j] = −div0(where(j ≤ i, A[i j] · A[i j], 0), B[i]) ;
""").models["M"]
    got = [format_expr(f) for f in normal_factors(model.nodes[0].rhs)]
    assert got == ["-1", "where(j ≤ i, 1, 0)", "A[i j]", "A[i j]", "div0(1, B[i])"]


def test_the_moe_backwards_gate_gradient_is_left_as_it_was():
    """`%dgate`'s first term multiplies `%dup`'s factors, but its second still reads `%dact` and Sgate: reading
    `%dup` too would be one more read, so nothing is rewritten."""
    model = load_program(ROOT / "examples" / "moe_mixtral.habu").models["MOE-FFN"]
    nodes = derive(model).model.nodes
    gate = next(eq for eq in nodes if eq.target == "%dgate")
    assert "%dup" not in tensors_read(gate.rhs)


def test_mutant_a_rebuilt_term_that_loses_its_sign_fails_the_adjoint_check(monkeypatch: pytest.MonkeyPatch):
    """The adjoint check over GF(p) is what makes the rewrite safe: a rebuilt term that drops its factor −1 (the
    row sum's `−div0(1, R2)` taken out of it) gives dS = P·s·(dP + D), and the check fails."""
    real = grad_cover.signed_product

    def unsigned(fs):
        return real([f for f in fs if f != MINUS_ONE])

    monkeypatch.setattr(grad_cover, "signed_product", unsigned)
    bw = derive(ATTENTION)
    _, ds, _ = _ds_and_p(bw)
    assert "−" not in format_expr(ds.rhs)
    assert not adjoint_check(bw, ATTENTION).passed
