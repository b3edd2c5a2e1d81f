"""GGEMM's backward in the contraction family (tests/data/ggemm_backward.habu): dB = Σ m dO[m n]·A[IX[m] k],
an operand gathered on the reduction axis, read through a staging pass that gathers A's rows into a
k-major buffer TMA reads; dA[IX[m] k] += Σ n dO[m n]·B[n k], a scatter-add epilogue adding each value with
f32 atomicAdd at the gathered row. The default on wgmma (its exact GPU check passed); the other paths by
`--pin family=contraction` and the search. Proven at ragged shapes; planted bugs killed by the field check
and the rules."""

from __future__ import annotations

from dataclasses import replace
from itertools import islice

import pytest

from habu.lower import ContractionLowering, lower_plan
from habu.lower.access import Position
from habu.lower.general import Store
from habu.paths.emit import emit_plan
from habu.plan.patterns import as_contraction, default_regions
from habu.prove import prove
from habu.prove.obligation import context
from habu.prove.rules import contraction_obligations
from habu.prove.verify import verify_plan
from habu.search.space import default_plan, enumerate_plans
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
PATH = ROOT / "tests" / "data" / "ggemm_backward.habu"
# ragged against every tile (128/64 rows, 64-deep k tiles); N and K multiples of 8 (TMA's 16-byte rows)
SIZES = {"M": 200, "N": 136, "K": 72}
PINS = {"family": "contraction"}


def _model(name: str):
    return load_program(PATH).models[name].with_sizes(SIZES)


@pytest.fixture(scope="module")
def plans():
    return {name: default_plan(_model(name), TARGET, SIZES, PINS) for name in ("GGEMM-DA", "GGEMM-DB")}


def _lowering(plans, name: str) -> ContractionLowering:
    (lw,) = lower_plan(_model(name), plans[name])
    assert isinstance(lw, ContractionLowering)
    return lw


def test_both_are_contractions_in_general_regions_whose_default_is_the_wgmma_contraction(plans):
    """Default since their exact GPU check passed (H200, 2026-12-02); on sm_80 (no wgmma) they stay general,
    and `--pin family=general` gives the general kernel back."""
    for name in ("GGEMM-DA", "GGEMM-DB"):
        model = _model(name)
        c = as_contraction(model.nodes[0])
        assert c is not None and not c.by_default
        assert [r.kind for r in default_regions(model)] == ["general"]
        assert default_plan(model, TARGET, SIZES, {}).kernels == plans[name].kernels
        assert [k.kind for k in default_plan(model, TARGETS["sm_80"], SIZES, {}).kernels] == ["general"]
        assert [k.kind for k in default_plan(model, TARGET, SIZES, {"family": "general"}).kernels] == ["general"]
    c = as_contraction(_model("GGEMM-DB").nodes[0])
    assert c is not None and c.b.load.tensor == "A" and c.b.k_gather == "IX" and c.b.gather is None


def test_the_pinned_plans_are_wgmma_with_a_staged_gather_and_a_scatter_epilogue(plans):
    (db,) = plans["GGEMM-DB"].kernels
    assert db.kind == "contraction" and db.mma == "wgmma" and db.b_move == "staged"
    lw = _lowering(plans, "GGEMM-DB")
    (stage,) = lw.pre
    assert [(p.kind, p.axis) for p in stage.src.positions] == [("gather", "k"), ("axis", "n")]
    assert [p.axis for p in stage.dst.positions] == ["n", "k"] and stage.tile  # k-major, a transposing pass
    (da,) = plans["GGEMM-DA"].kernels
    assert da.kind == "contraction" and da.mma == "wgmma" and da.store == "direct"
    lw = _lowering(plans, "GGEMM-DA")
    assert lw.store is Store.ATOMIC_ADD and lw.atomic_store and not lw.zeroed_output and lw.epilogue_pairs
    assert [(p.kind, p.table) for p in lw.out.positions] == [("gather", "IX"), ("axis", "")]
    (kernel,) = emit_plan(_model("GGEMM-DA"), plans["GGEMM-DA"], TARGET).kernels
    assert not kernel.zero and "habu::atomic_add_f2(p_dA + off, v0, v1)" in kernel.source  # pairs: a vector reduction
    # IX is read for the pair's offset only where the row is inside (m < #M: no read past IX's end)
    assert "const int off = ((m) < 200 && (n) < 72 && habu::index_ok((long long)p_IX[m]" in kernel.source


def test_the_search_space_holds_the_wgmma_default_its_variants_and_the_general_kernel():
    kernels = [p.kernels[0] for p in islice(enumerate_plans(_model("GGEMM-DB"), TARGET, SIZES), 200)]
    assert kernels[0].kind == "contraction" and kernels[1].kind == "general"
    assert {k.kind for k in kernels[2:]} == {"contraction"}


@pytest.mark.parametrize("name", ["GGEMM-DA", "GGEMM-DB"])
def test_the_pinned_plans_are_proven_at_ragged_shapes(plans, name):
    proof = prove(_model(name), plans[name], SIZES, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]


def _killed(plans, name: str, mutant: ContractionLowering) -> str:
    cert = verify_plan(_model(name), plans[name], SIZES, trials=1, seeds=[3], lowerings=[mutant])
    assert not cert.passed, "the mutant survived the field check"
    return cert.failure or ""


def test_regression_a_scatter_whose_row_is_not_gathered_is_killed(plans):
    lw = _lowering(plans, "GGEMM-DA")
    plain_row = replace(lw.out, positions=tuple(Position("axis", p.axis) if p.kind == "gather" else p
                                                for p in lw.out.positions), checks=())
    _killed(plans, "GGEMM-DA", replace(lw, out=plain_row))


def test_regression_a_plain_store_where_the_scatter_must_add_is_killed_and_refused(plans):
    lw = _lowering(plans, "GGEMM-DA")
    _killed(plans, "GGEMM-DA", replace(lw, store=Store.WRITE))  # duplicates in IX overwrite each other
    ctx = context(_model("GGEMM-DA"), plans["GGEMM-DA"])
    for store, holds in ((Store.ATOMIC_ADD, True), (Store.WRITE, False)):
        (ob,) = [o for o in contraction_obligations("k0", replace(lw, store=store), ctx)
                 if o.rule.name == "scatter-accumulates"]
        assert (ob.formula is True) is holds


def test_regression_a_staged_gather_on_the_wrong_axis_is_killed(plans):
    lw = _lowering(plans, "GGEMM-DB")
    (stage,) = lw.pre
    ungathered = replace(stage.src, positions=tuple(Position("axis", p.axis) if p.kind == "gather" else p
                                                    for p in stage.src.positions), checks=())
    _killed(plans, "GGEMM-DB", replace(lw, pre=(replace(stage, src=ungathered),)))
    # the gather moved onto the staged rows (n) from the reduction axis (k)
    wrong = replace(stage.src, positions=(Position("axis", "k"), Position("gather", "n", table="IX")))
    _killed(plans, "GGEMM-DB", replace(lw, pre=(replace(stage, src=wrong),)))


def test_a_k_gathered_operand_that_is_not_staged_is_refused(plans):
    model = _model("GGEMM-DB")
    plan = replace(plans["GGEMM-DB"], kernels=(replace(plans["GGEMM-DB"].kernels[0], b_move="cp.async"),))
    proof = prove(model, plan, SIZES, trials=1)
    assert not proof.ok
    assert any("gathered on the reduction axis" in o.detail for o in proof.violations)


def test_regression_the_f32_ggemm_backward_pins_only_what_a_contraction_path_reads():
    """examples/ggemm.habu's backward has an f32 dO (its O is f32): no tensor cores, so no path read dB's
    staged gather and `--pin family=contraction` left the whole plan refused (supported-path); dB stayed
    general while dA took the SIMT contraction with the scatter-add epilogue. Since session 69 the SIMT path reads
    a staged operand's buffer, so the pin makes dB a SIMT contraction too; the default keeps dB general (the two are
    not timed against each other)."""
    from habu.cli_grad import backward_program
    from habu.compile import bind_shape

    program, name = backward_program(load_program(ROOT / "examples" / "ggemm.habu"), "GGEMM", None, "auto")
    model = bind_shape(program.model(name), SIZES)
    plan = default_plan(model, TARGET, SIZES, PINS)
    assert [(k.kind, getattr(k, "mma", None)) for k in plan.kernels] == [("contraction", "fma"), ("contraction", "fma")]
    assert "staged" in (plan.kernels[1].a_move, plan.kernels[1].b_move)
    # the SIMT scatter passed its exact GPU check (tests/gpu/test_ggemm_backward.py, 2026-12-02): the default
    default = default_plan(model, TARGET, SIZES, {}).kernels
    assert default[0] == plan.kernels[0] and default[1].kind == "general"
    proof = prove(model, plan, SIZES, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]


def test_regression_the_baseline_of_a_scatter_or_k_gathered_contraction_is_torch_eager(monkeypatch):
    """The contraction baseline (`A[IX] @ B.T`) gathered only the rows of m and stored plainly: for dB it
    would have read A's rows ungathered, for dA overwritten instead of adding at IX."""
    import habu.timing.torch_eager as eager
    from habu.timing.baselines import torch_baseline

    monkeypatch.setattr(eager, "TorchEager", lambda model, sizes: sizes)
    for name in ("GGEMM-DA", "GGEMM-DB"):
        text, _ = torch_baseline(_model(name), {})
        assert text == eager.describe(_model(name))


def test_regression_a_scatter_on_the_columns_runs_every_column_tile_in_the_check():
    """`dA[m JX[k]] += Σ n …`: the field check ran every row tile of a scatter but only sampled column tiles,
    while any column may land on a compared one. Proven with the pin (pairs stay scalar: JX's columns are
    not adjacent); not a default (the GPU tested scattered rows)."""
    from habu.spec.parser import parse_text

    text = PATH.read_text().replace("ITENSOR: IX ( #M #M )", "ITENSOR: IX ( #M #M )  ITENSOR: JX ( #K #K )")
    text += "MODEL: COLS  dA[m JX[k]] += Σ n dO[m n] · B[n k] ;\n"
    sizes = {**SIZES, "K": 520}  # 9 column tiles of 64: more than the check samples
    model = parse_text(text).models["COLS"].with_sizes(sizes)
    assert [k.kind for k in default_plan(model, TARGET, sizes, {}).kernels] == ["general"]
    plan = default_plan(model, TARGET, sizes, PINS)
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ContractionLowering) and not lw.epilogue_pairs
    assert [(p.kind, p.axis) for p in lw.out.positions] == [("axis", "m"), ("gather", "n")]
    cert = verify_plan(model, plan, sizes, trials=1, seeds=[4])
    assert cert.passed, cert.failure
    (text,) = cert.blocks.values()
    checked_k = (cert.witness or sizes)["K"]  # a scatter checks on the witness shape
    assert -(-checked_k // lw.bn) >= 5 and f"n {list(range(-(-checked_k // lw.bn)))}" in text, text
