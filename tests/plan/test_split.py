"""`split:T`: a contraction written inside a larger expression gets a node of its own, so the
contraction family (not the general one) computes it, the rest fused as its epilogue."""

from __future__ import annotations

from habu.plan.rewrite import applicable, default_rewrites
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
SCALED = """3 EXTENT: #B  72 EXTENT: #I  80 EXTENT: #J  64 EXTENT: #D
bf16 TENSOR: Q ( #B #I #D )  bf16 TENSOR: K ( #B #J #D )  bf16 TENSOR: M ( #B #I #J )  f32 TENSOR: S ( #B #I #J )
MODEL: SCORES  S[b i j] = (Σ d Q[b i d] · K[b j d]) · 0.125 + M[b i j] ;
"""


def test_regression_a_contraction_inside_a_larger_expression_fell_to_the_general_family():
    (model,) = parse_text(SCALED, "scaled.habu").models.values()
    assert applicable(model) == ["split:S"] and default_rewrites(model) == ("split:S",)
    plan = default_plan(model, TARGET)
    assert plan.rewrites == ("split:S",)
    (k,) = plan.kernels
    assert (k.kind, k.mma, k.nodes) == ("contraction", "wgmma", ("S.mm", "S"))  # the rest is its epilogue
    proof = prove(model, plan, {}, trials=1)  # checked against the model as written
    assert proof.ok, [o.describe() for o in proof.violations] or proof.certificate


def test_a_reduction_that_is_no_contraction_is_not_split():
    rmsnorm = load_program(ROOT / "examples" / "rmsnorm.habu").models["RMSNORM-ROWS"]
    assert not any(name.startswith("split:") for name in applicable(rmsnorm))
    split = {(path.name, model.name) for path in sorted((ROOT / "examples").glob("*.habu"))
             for model in load_program(path).models.values() if default_rewrites(model)}
    # the one example with a contraction inside an expression, and the attention examples (whose
    # scores are one once attention:O has made them a node)
    assert split == {("accumulate.habu", "GEMM-ACC"), ("attention.habu", "ATTENTION-GQA"),
                     ("decode_attention.habu", "DECODE-ATTENTION")}


def test_regression_an_accumulating_gemm_ran_on_the_general_family():
    """`C[m n] += Σ k A[m k] · B[n k]` reads as C = C + Σ ...: split, the contraction runs on tensor
    cores with `+ C` as its epilogue (no split-K: the epilogue is not linear in the accumulator)."""
    model = load_program(ROOT / "examples" / "accumulate.habu").models["GEMM-ACC"]
    plan = default_plan(model, TARGET)
    (k,) = plan.kernels
    assert plan.rewrites == ("split:C",) and (k.kind, k.mma, k.split_k) == ("contraction", "wgmma", 1)
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations] or proof.certificate


def test_regression_an_epilogue_reading_through_a_gather_is_not_split():
    """Split, `Y = A[IX[m] n] + Σ k X·W` put a gathered load in a wgmma epilogue, which the emitter
    refused with a ValueError (no index check printed there): such a node stays one general kernel."""
    text = """64 EXTENT: #M  48 EXTENT: #N  32 EXTENT: #K
bf16 TENSOR: X ( #M #K )  bf16 TENSOR: W ( #N #K )  f32 TENSOR: A ( #M #N )  ITENSOR: IX ( #M #M )
f32 TENSOR: Y ( #M #N )
MODEL: G  Y[m n] = A[IX[m] n] + Σ k X[m k] · W[n k] ;
"""
    (model,) = parse_text(text, "g.habu").models.values()
    assert applicable(model) == [] and default_plan(model, TARGET).kernels[0].kind == "general"


def test_a_split_that_changes_the_values_is_caught_by_the_finite_field_check(monkeypatch):
    """The rewrite is kept only because the proof checks the rewritten plan against the model as
    written: a planted split that drops the rest of the expression (S = S.mm, without `· 0.125 + M`)
    must fail that check on the CPU."""
    from habu.plan import rewrite, split
    from habu.spec.ir import Load

    def dropped_rest(e, old, new):
        return new if isinstance(new, Load) else e

    rewrite._apply_rewrites.cache_clear()
    monkeypatch.setattr(split, "replaced", dropped_rest)
    try:
        (model,) = parse_text(SCALED, "scaled.habu").models.values()
        plan = default_plan(model, TARGET)
        assert plan.rewrites == ("split:S",)
        proof = prove(model, plan, {}, trials=1)
        assert proof.certificate is not None and not proof.certificate.passed
    finally:
        rewrite._apply_rewrites.cache_clear()
