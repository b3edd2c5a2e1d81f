"""A contraction's k window (habu/lower/k_bounds.py): the k tiles an output tile skips where the model makes its terms
zero, the same formulas for the interpreter (ints), the `k-window` rule (z3) and the emitter (C), and the checks
that catch a wrong one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.bench.mutants_window import operand_bound_one_tile_in, zero_tile_one_tile_early
from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.nvrtc import compile_cuda
from habu.lower import lower_plan
from habu.lower.contraction import ContractionLowering
from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.prove.rules import failures, obligations
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
PROGRAM = load_program(ROOT / "tests" / "data" / "causal_chain.habu")


def _plan(name: str, pins: dict[str, str] | None = None):
    model = PROGRAM.models[name]
    return model, default_plan(model, T, {}, pins or {})


def _products(model, plan) -> list[ContractionLowering]:
    return [lw for lw in lower_plan(model, plan) if isinstance(lw, ContractionLowering)]


def test_the_default_skips_the_tiles_above_the_diagonal_and_the_k_tiles_past_it():
    model, plan = _plan("CAUSAL-CHAIN", {"tile": "64x64x64"})
    assert [k.skip_zero for k in plan.kernels] == [True, True]
    scores, values = _products(model, plan)
    s = dict(model.sizes)
    # P[m n] = where(n ≤ m, …): tile (tm, tn) is zero when its first column is past its last row
    for tm in range(4):
        assert [scores.tile_k_range(0, s, tm, tn) != (0, 0) for tn in range(6)] == [tn <= tm for tn in range(6)]
    # Y[m e] = Σ n P[m n]·C[n e]: the rows m < 64(tm + 1) need the keys n ≤ m, one 64-wide k tile a row tile
    assert [values.tile_k_range(0, s, tm, 0) for tm in range(4)] == [(0, 1), (0, 2), (0, 3), (0, 4)]


def test_a_transposed_reader_starts_its_k_loop_at_the_diagonal():
    model, plan = _plan("CAUSAL-CHAIN-T", {"tile": "64x64x64"})
    _, values = _products(model, plan)
    s = dict(model.sizes)  # YT[n e] = Σ m P[m n]·CM[m e]: the keys n need the rows m ≥ n (#M = 200: 4 k tiles)
    assert [values.tile_k_range(0, s, tm, 0) for tm in range(6)] == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4), (5, 4)]


def test_attention_backwards_windows_follow_the_queries_offset_among_the_keys():
    from habu.bench.mutants import Mutant
    from habu.bench.mutants_window import MODEL, SHAPE

    model = Mutant("", "", "attention.habu", MODEL, SHAPE, lambda lw: lw).load_model()
    plan = default_plan(model, T, SHAPE, {})
    lws = lower_plan(model, plan)
    dq, dk = (lw for lw in lws if isinstance(lw, ContractionLowering) and lw.out.tensor in ("dQ", "dK.in"))
    s = dict(plan.shape)
    # 300 queries, the last of 1000 keys: query i sees the keys j ≤ i + 700
    for tm in range(-(-300 // dq.bm)):
        last_key = min(dq.bm * (tm + 1) - 1 + 700, 999)  # the tile's last row sees up to here
        assert dq.tile_k_range(0, s, tm, 0) == (0, last_key // dq.bk + 1)
    for tm in range(-(-1000 // dk.bm)):
        first_query = max(0, dk.bm * tm - 700)  # the tile's first key is seen from this query on
        assert dk.tile_k_range(0, s, tm, 0) == (min(first_query // dk.bk, -(-300 // dk.bk)), -(-300 // dk.bk))


def test_the_same_window_prints_in_c_and_compiles():
    model, plan = _plan("CAUSAL-CHAIN", {"tile": "64x64x64"})
    _, values = _products(model, plan)
    begin, end = values.tile_k_range(CExpr("split"), dict(model.sizes), CExpr("tm"), CExpr("tn"))
    assert "max(" in c(begin) or "min(" in c(end)
    sources = emit_plan(model, plan, T)
    for k in sources.kernels:
        compile_cuda(k.source, k.name, T.name)


def test_without_skip_zero_no_tile_is_skipped():
    model, plan = _plan("CAUSAL-CHAIN", {"skip_zero": "false"})
    assert not any(lw.window for lw in _products(model, plan))


def test_a_cluster_along_m_keeps_only_the_bounds_along_n():
    model, plan = _plan("CAUSAL-CHAIN", {"tile": "128x64x64", "cluster": "2"})
    assert all(not lw.window.outputs and all(b.axis == "n" for b in lw.window.operands)
               for lw in _products(model, plan))


@pytest.mark.parametrize("pins", [{}, {"tile": "64x64x64"}, {"tile": "128x128x64"}, {"mma": "mma.sync"},
                                  {"mma": "fma"}, {"persistent": "true", "tile": "64x64x64"}],
                         ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default")
@pytest.mark.parametrize("name", ["CAUSAL-CHAIN", "CAUSAL-CHAIN-T"])
def test_windowed_plans_prove(name, pins):
    model, plan = _plan(name, pins)
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, proof.certificate.failure if proof.certificate else [o.detail for o in proof.violations]
    rules = [o for o in proof.obligations if o.rule.name == "k-window"]
    assert len(rules) == 2 and all(o.status == "proved" for o in rules)


@pytest.mark.parametrize("plant", [operand_bound_one_tile_in, zero_tile_one_tile_early])
def test_the_k_window_rule_refuses_a_window_one_tile_too_narrow(plant, monkeypatch):
    model, plan = _plan("CAUSAL-CHAIN", {"tile": "64x64x64"})
    lws = lower_plan(model, plan)
    index = 1 if plant is operand_bound_one_tile_in else 0
    lws[index] = plant(lws[index])
    bad = failures(obligations(model, plan, {}, lowered=replace_kernels(model, plan, lws)))
    assert [o.rule.name for o in bad] == ["k-window"], [o.detail for o in bad]
    assert bad[0].counterexample


def replace_kernels(model, plan, lws):
    from habu.lower import lower_whole

    lowered = lower_whole(model, plan)
    return replace(lowered, kernels=tuple(lws))


def test_the_report_says_what_each_window_skips(tmp_path):
    from typer.testing import CliRunner

    from habu.cli import app

    result = CliRunner().invoke(app, ["compile", str(ROOT / "tests" / "data" / "causal_chain.habu"), "--model",
                                      "CAUSAL-CHAIN", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    report = (tmp_path / "report.md").read_text()
    assert "its stored values are zero outside −m + n ≤ 0, whatever the product" in report
    assert "%1 is zero outside k − m ≤ 0" in report
    assert "| k-window | kernel 1 (Y) | Y |" in report


def test_regression_a_window_wrong_only_outside_the_sampled_rows_is_caught():
    """Session 66: the first field check of a window compared the sampled output elements only, and a dK window one
    tile late passed (its wrong rows, keys 896–955 of 1000, were in no sampled element of dK). A windowed kernel now
    runs whole tiles and compares each stored value with the skipped terms added back."""
    from habu.bench.mutants import MUTANTS, run_mutant

    mutant = next(m for m in MUTANTS if m.name == "window-dk-bound-one-tile-in")
    outcome = run_mutant(mutant, trials=1)
    assert outcome.killed and "the k tiles its window skips change dK.in[" in outcome.message, outcome.message


def test_regression_a_window_on_a_staged_operand_is_proven():
    """Session 67's fuzz (tests/random_models.py `random_masked_product`, seed 313, backward): dA = Σ n Th1·W reads
    the masked Th1 through a staged copy (`@%h1`, habu/lower/staging.py); the window bounded its k loop by Th1's
    condition, but the k-window rule looked the copy's name up among the model's supports, found none, and refused
    a right window: `habu compile --backward` failed with "breaks rule k-window"."""
    from habu.cli_grad import backward_program
    from habu.compile import bind_shape
    from habu.spec.parser import parse_text

    text = ("256 EXTENT: #M 511 EXTENT: #N 16 EXTENT: #K\nbf16 TENSOR: A ( #K #M )\nbf16 TENSOR: W ( #N #K )\n"
            "bf16 TENSOR: Y ( #M #N )\nMODEL: FZ  Y[m n] = where(n ≤ m + #N − #M, erf(Σ k A[k m] · W[n k]), −∞) + 1 ;\n")
    program, name = backward_program(parse_text(text, "fuzz.habu"), "FZ", None, "auto")
    model = bind_shape(program.models[name], {})
    plan = default_plan(model, T, {}, {})
    staged = [lw for lw in _products(model, plan) if lw.window and lw.b.tensor.startswith("@")]
    assert staged and staged[0].b_src.tensor == "%h1", [(lw.out.tensor, lw.b.tensor) for lw in _products(model, plan)]
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.detail for o in proof.violations]
    assert any(o.rule.name == "k-window" and o.status == "proved" for o in proof.obligations)


def test_regression_a_column_sum_beside_zero_tiles_is_finished_over_every_block():
    """Session 67's fuzz (`random_masked_product` seed 349, backward): Th1 = dY · mask · exp(A·Wᵀ + C) is stored
    with its zero tiles' k loops skipped, and dC = Σ m Th1 summed in the same epilogue. The field check ran each
    group of blocks (a window groups them by k range) through the column sum's combine on its own, so no group
    brought a column tile's counter to its arrivals: "dC[0] was never written", the plan refused. The blocks'
    sums are now combined once every block has run, as the GPU's counters see them."""
    from habu.cli_grad import backward_program
    from habu.compile import bind_shape
    from habu.spec.parser import parse_text

    text = ("256 EXTENT: #M 128 EXTENT: #N 256 EXTENT: #K\nbf16 TENSOR: A ( #M #K )\nbf16 TENSOR: W ( #N #K )\n"
            "f32 TENSOR: C ( #N )\nbf16 TENSOR: Y ( #M #N )\n"
            "MODEL: FZ  Y[m n] = (exp((Σ k A[m k] · W[n k]) + C[n])) · where(n ≤ m + #N − #M, 1, 0) ;\n")
    program, name = backward_program(parse_text(text, "fuzz.habu"), "FZ", None, "auto")
    model = bind_shape(program.models[name], {})
    plan = default_plan(model, T, {}, {})
    first = _products(model, plan)[0]
    assert first.window.outputs and first.column_sum is not None
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, proof.certificate.failure if proof.certificate else [o.detail for o in proof.violations]


# the fuzz's attention seed 7311 (tests/random_models.py, `random_attention`): one query, 17 keys, causal `j < i`
ONE_QUERY = """1 EXTENT: #B 128 EXTENT: #D 64 EXTENT: #E 2 EXTENT: #G 1 EXTENT: #I 17 EXTENT: #J 1 EXTENT: #R
bf16 TENSOR: Q ( #B #G #R #I #E )
bf16 TENSOR: K ( #B #G #J #E )
bf16 TENSOR: V ( #B #G #J #D )
f32 TENSOR: O ( #I #G #D #R #B )
MODEL: FZ  O[i g d r b] = Σ j softmax_j(where(j < i, Σ e Q[b g r i e] · K[b g j e], −∞)) · V[b g j d] ;
"""


def test_regression_the_field_check_read_what_a_windowed_product_skips_where_no_earlier_kernel_had_computed_it():
    """The backward's dV.in = Σ i dO·%h3 skips the k tiles where %h3 (P, copied by a map kernel) is zero. The check
    runs every row and column of a windowed product's tiles and sums the skipped terms to show they are zero, but it
    had asked the map kernel only for %h3's rows dV's sampled rows read: it refused the right plan ("dV.in reads
    %h3[0, 0, 0, 0, 9], which no earlier kernel wrote"). The rows of a windowed product's tiles are demanded whole
    (habu.prove.demand: `whole_tiles`)."""
    from habu.cli_grad import backward_program
    from habu.spec.parser import parse_text

    program, name = backward_program(parse_text(ONE_QUERY, "fuzz.habu"), "FZ", None, "auto")
    model = program.models[name]
    plan = default_plan(model, T, {}, {})
    assert any(lw.window for lw in _products(model, plan))
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, proof.certificate.failure if proof.certificate else proof
