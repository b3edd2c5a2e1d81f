"""`epilogue:P` (habu/plan/epilogue_inline.py): an elementwise node read by one contraction epilogue node is
computed inside that epilogue, not by a kernel of its own (the FFN backward's recomputed GELU input)."""

from __future__ import annotations

import pytest

from habu.cli_grad import backward_program
from habu.compile import bind_shape
from habu.lower import ContractionLowering, lower_plan
from habu.plan.rewrite import applicable, default_rewrites
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import EXAMPLES

TARGET = TARGETS["sm_90a"]
DECLS = """64 EXTENT: #M  48 EXTENT: #N  32 EXTENT: #K  1 EXTENT: #ONE
bf16 TENSOR: X ( #M #K )  bf16 TENSOR: W ( #N #K )  bf16 TENSOR: A ( #M #N )  bf16 TENSOR: C ( #ONE #N )
ITENSOR: IX ( #M #M )  bf16 TENSOR: Y ( #M #N )  bf16 TENSOR: Z ( #M #N )
"""
GATED = DECLS + """MODEL: GATED
  P[m n] = A[m n] + C[0 n]
  T[m n] = Σ k X[m k] · W[n k]
  Y[m n] = T[m n] · sigmoid(P[m n]) · P[m n] ;
"""


def _model(text: str):
    (model,) = parse_text(text, "e.habu").models.values()
    return model


def test_an_elementwise_node_read_by_one_epilogue_is_computed_in_it():
    model = _model(GATED)
    assert applicable(model) == ["epilogue:P"] and default_rewrites(model) == ("epilogue:P",)
    plan = default_plan(model, TARGET)
    (k,) = plan.kernels
    assert (k.kind, k.nodes) == ("contraction", ("T", "Y"))
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ContractionLowering) and {ld.tensor for ld, _ in lw.epi_loads} == {"A", "C"}
    proof = prove(model, plan, {}, trials=1)  # checked against the model as written
    assert proof.ok, [o.describe() for o in proof.violations] or proof.certificate


@pytest.mark.parametrize("why,body", [
    ("two readers", "P[m n] = A[m n] + C[0 n]  T[m n] = Σ k X[m k] · W[n k]  Y[m n] = T[m n] · P[m n]  "
                    "Z[m n] = P[m n] · 2"),
    ("read through a gather", "P[m n] = A[IX[m] n] · 2  T[m n] = Σ k X[m k] · W[n k]  Y[m n] = T[m n] · P[m n]"),
    ("its reader no epilogue", "P[m n] = A[m n] + C[0 n]  Y[m n] = P[m n] · 3"),
    ("a reduction", "P[m n] = A[m n] · (Σ n2 A[m n2])  T[m n] = Σ k X[m k] · W[n k]  Y[m n] = T[m n] · P[m n]"),
])
def test_what_epilogue_inlining_leaves_alone(why, body):
    model = _model(DECLS + f"MODEL: M\n  {body} ;\n")
    assert not [r for r in applicable(model) if r.startswith("epilogue:")], why


def test_regression_ffn_backward_recomputed_gelu_input_was_a_kernel_of_its_own():
    """With the GELU output saved (AUTO saves a contraction operand), the backward's T2 = S1 + B1 has one
    reader, the GELU derivative in the epilogue of dT3 = Σ d dT6·W2; it was a rows kernel writing B×H
    values that the epilogue read back. Now the epilogue reads S1 and B1: 9 kernels where there were 11 (7 since each
    bias gradient is stored by its column kernel, 5 since dB1 and dB2 are summed in the epilogues that make dT2
    and dX)."""
    program, name = backward_program(load_program(EXAMPLES[0].parent / "ffn_skip.habu"), "FFN-SKIP", None, "auto")
    shape = {"B": 128, "D": 256, "H": 512}
    model = bind_shape(program.model(name), shape)
    plan = default_plan(model, TARGET, shape, {})
    assert plan.rewrites == ("epilogue:%2",)
    assert [k.nodes for k in plan.kernels][:2] == [("%5", "%6", "%d6"), ("%d3", "%d2", "%rdB1", "dB1")]
    assert len(plan.kernels) == 5
    lw = lower_plan(model, plan)[1]
    assert {ld.tensor for ld, _ in lw.epi_loads} == {"S1", "B1"}
    proof = prove(model, plan, shape, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations] or proof.certificate


def test_an_epilogue_inlining_that_changes_the_values_is_caught_by_the_finite_field_check(monkeypatch):
    """The rewrite is kept because the proof checks the rewritten plan against the model as written: a
    planted inlining that drops P's bias (P = A instead of A + C) must fail that check on the CPU."""
    from habu.plan import epilogue_inline, rewrite
    from habu.spec.ir import Load, Op, rename_vars

    def dropped_bias(expr, eq):
        if isinstance(expr, Load) and expr.tensor == eq.target:
            first = eq.rhs.args[0] if isinstance(eq.rhs, Op) else eq.rhs
            return rename_vars(first, dict(zip(eq.lhs, expr.indices, strict=True)))
        if isinstance(expr, Op):
            return Op(expr.fn, tuple(dropped_bias(a, eq) for a in expr.args))
        return expr

    rewrite._apply_rewrites.cache_clear()
    monkeypatch.setattr(epilogue_inline, "_substitute", dropped_bias)
    try:
        model = _model(GATED)
        plan = default_plan(model, TARGET)
        assert plan.rewrites == ("epilogue:P",)
        proof = prove(model, plan, {}, trials=1)
        assert proof.certificate is not None and not proof.certificate.passed
    finally:
        rewrite._apply_rewrites.cache_clear()
