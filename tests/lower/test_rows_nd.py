"""Row kernels over N-D tensors: the reduction along the last axis, the leading axes flattened into rows
(habu/plan/patterns.py `row_axes`, the lowering's row index → leading coordinates map
`RowLowering.row_coordinates`, printed by the emitter and run by the finite-field interpreter)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.emit_cuda.cexpr import CExpr, c
from habu.lower import RowLowering, lower_plan
from habu.paths.emit import emit_plan
from habu.plan.patterns import default_regions, row_local
from habu.prove import prove
from habu.prove.rules import failures
from habu.prove.verify import verify_plan
from habu.search.space import default_plan, enumerate_plans
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
RMS3 = ("{B} EXTENT: #B  {S} EXTENT: #S  {D} EXTENT: #D\n"
        "f32 TENSOR: X ( #B #S #D )  f32 TENSOR: W ( #D )  f32 TENSOR: Y ( #B #S #D )\n"
        "MODEL: RMS3  Y[b s d] = X[b s d] · W[d] · rsqrt( Σ d' X[b s d'] · X[b s d'] / #D + 0.000001 ) ;\n")


def rms3(b: int = 3, s: int = 5, d: int = 70):
    return parse_text(RMS3.format(B=b, S=s, D=d), "rms3.habu").models["RMS3"]


def test_regression_a_three_dimensional_rmsnorm_fell_to_the_general_family():
    """Y[b s d] = RMSNorm(X[b s d]) was one general kernel (a thread per element, the sum of squares
    recomputed by each); it is a row kernel over the #B·#S flattened rows now."""
    model = rms3()
    assert row_local(model.nodes[0]) == (("B", "S"), "D")
    assert [r.kind for r in default_regions(model)] == ["rows"]
    plan = default_plan(model, TARGET, {}, {})
    assert [k.kind for k in plan.kernels] == ["rows"]
    assert verify_plan(model, plan, trials=2).passed


def test_the_emitted_row_decode_is_printed_from_the_lowering():
    model = rms3()
    plan = default_plan(model, TARGET, {}, {})
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, RowLowering) and lw.leading == ("B", "S") and lw.row_axes == ("r#0", "r#1")
    coords = lw.row_coordinates(CExpr("r"), {"B": 3, "S": 5, "D": 70})
    assert (c(coords["r#0"]), c(coords["r#1"])) == ("(r / 5)", "(r % 5)")
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "(int)((r / 5)) * (int)(350) + (int)((r % 5)) * (int)(70)" in kernel.source  # X's offset
    assert "if (!(((r / 5)) < 3 && ((r % 5)) < 5)) return;" in kernel.source  # the row bound, r < #B·#S


@pytest.mark.parametrize("shape", [(3, 5, 70), (1, 1, 1), (2, 1, 33), (1, 7, 4096), (5, 3, 8)],
                         ids=lambda s: "x".join(map(str, s)))
def test_every_sampled_plan_of_an_n_d_rmsnorm_passes_the_check(shape):
    """Tails (70 columns: no whole 16-byte vectors), 1-element extents, warp rows over the flattened rows
    (4 a block: blocks straddle #S), a row in registers (4096)."""
    model = rms3(*shape)
    plans = list(enumerate_plans(model, TARGET, {}))[:12]
    assert plans
    for plan in plans:
        proof = prove(model, plan, {}, trials=1)
        assert proof.ok, (plan.kernels, failures(proof.obligations)[:1], proof.certificate)


def test_a_four_dimensional_softmax_and_a_row_statistic_are_row_kernels():
    text = ("2 EXTENT: #Z  3 EXTENT: #H  5 EXTENT: #I  37 EXTENT: #J\n"
            "f32 TENSOR: S ( #Z #H #I #J )  f32 TENSOR: P ( #Z #H #I #J )  f32 TENSOR: M ( #Z #H #I )\n"
            "MODEL: SM4  P[z h i j] = exp(S[z h i j] - max j2 S[z h i j2]) / Σ j3 exp(S[z h i j3] - max j4 S[z h i j4]) ;\n"
            "MODEL: MAX3  M[z h i] = max j S[z h i j] ;\n")
    for name in ("SM4", "MAX3"):
        model = parse_text(text, "sm4.habu").models[name]
        plan = default_plan(model, TARGET, {}, {})
        assert [k.kind for k in plan.kernels] == ["rows"], name
        assert verify_plan(model, plan, trials=2).passed, name


def test_a_batched_product_is_no_row_statistic():
    """`S[b i j] = Σ d Q[b i d] · K[b j d]` reads no tensor's whole (b, i, j) rows: it is not taken as
    a row statistic over #B·#I·#J rows."""
    model = load_program(ROOT / "examples" / "bmm.habu").models["SCORES"]
    assert row_local(model.nodes[0]) is None


def test_the_int32_rule_covers_the_flattened_row_offset():
    """64 × 8192 rows of 4097 columns: X's offsets pass 2^31 − 1 (2^31 + ...) although each leading
    coordinate and #D alone are small; 32-bit indices are refused by the rules, 64-bit ones pass."""
    model = rms3(64, 8192, 4097)
    plan = default_plan(model, TARGET, {}, {})
    assert plan.kernels[0].index_width == 64
    narrow = replace(plan, kernels=(replace(plan.kernels[0], index_width=32),))
    bad = failures(prove(model, narrow, {}, trials=1).obligations)
    assert any(o.rule.name == "int32-offsets" and "flattened row" in o.statement for o in bad), bad
    assert not failures(prove(model, plan, {}, trials=1).obligations)
