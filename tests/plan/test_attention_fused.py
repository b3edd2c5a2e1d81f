"""`fused:T` (habu/plan/attention_fused.py): a training forward's unfused attention nodes (the derived backward's
saved row maximum and sum beside O) joined back into one softmax-weighted sum, which the fused attention kernel
computes while it stores the statistics (`AttentionLowering.stats`); proven over Z_q × GF(p) on both main loops,
with planted mistakes that the check rejects."""

from __future__ import annotations

from dataclasses import replace

import pytest

import habu.prove.interp_attention as interp_attention
import habu.prove.interp_attention_wgmma as interp_attention_wgmma
from habu.emit_cuda.nvrtc import compile_cuda
from habu.lower.attention import AttentionLowering
from habu.lower.attention_wgmma import AttentionWgmmaLowering
from habu.paths.emit import emit_plan
from habu.plan.attention_fused import attention_statistics, chain_parts, fused_view
from habu.plan.patterns import default_regions
from habu.plan.rewrite import applicable, apply_rewrites
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.ir import Reduce
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

SM90 = TARGETS["sm_90a"]
WGMMA = {"family": "attention", "main_loop": "wgmma", "pingpong": "1", "persistent": "1"}


def training_forward(path: str = "examples/attention.habu", name: str = "ATTENTION-GQA", **sizes: int):
    program = load_program(ROOT / path)
    forward = derive_model(program, name, None).forward
    return forward.with_sizes(sizes) if sizes else forward


def test_the_derived_forward_is_the_unfused_chain_and_fused_joins_it_into_one_sum_and_its_statistics():
    fwd = training_forward()
    assert [e.target for e in fwd.nodes] == ["%f2", "R1", "R2", "%f1", "O"]
    assert "fused:O" in applicable(fwd)
    fused = apply_rewrites(fwd, ("fused:O",))
    assert [e.target for e in fused.nodes] == ["R1", "R2", "O"]
    assert {t.name for t in fused.intermediates} & {"%f1", "%f2"} == set()
    assert attention_statistics(fused, ("R1", "R2", "O")) is not None
    assert attention_statistics(fused, ("R2", "R1", "O")) is None  # the maximum first, then the sum
    assert [(r.kind, r.nodes) for r in default_regions(fused)] == [("general", ("R1", "R2", "O"))]


def test_a_chain_whose_statistic_is_not_the_softmax_maximum_is_not_joined():
    fwd = training_forward()
    r1 = next(e for e in fwd.nodes if e.target == "R1")
    assert isinstance(r1.rhs, Reduce)
    summed = replace(fwd, nodes=tuple(replace(e, rhs=replace(e.rhs, op="sum")) if e is r1 else e for e in fwd.nodes))
    assert chain_parts(summed, "O") is None
    assert fused_view(summed) is summed


def test_a_long_training_forward_defaults_to_one_fused_kernel_and_a_short_one_stays_unfused():
    long_plan = default_plan(training_forward(I=1024, J=1024), SM90, {})
    assert long_plan.rewrites == ("fused:O",)
    [kernel] = long_plan.kernels
    assert (kernel.kind, kernel.nodes, kernel.main_loop) == ("attention", ("R1", "R2", "O"), "wgmma")
    short_plan = default_plan(training_forward(), SM90, {})  # 40 queries: below WGMMA_PREFILL_ROWS
    assert [k.kind for k in short_plan.kernels] == ["contraction", "rows", "contraction"]


@pytest.mark.parametrize("pins, sizes", [({"family": "attention"}, {}),
                                         (WGMMA, {"I": 300, "J": 300})], ids=["mma.sync", "wgmma"])
def test_the_fused_kernel_storing_the_statistics_is_proven_and_compiles(pins, sizes):
    model = training_forward(**sizes)
    plan = default_plan(model, SM90, {}, pins)
    assert [k.nodes for k in plan.kernels] == [("R1", "R2", "O")]
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations] or proof.certificate.failure
    [kernel] = emit_plan(model, plan, SM90).kernels
    assert "m[h] * habu::LN2" in kernel.source if pins.get("main_loop") else "m[mi][h] * habu::LN2" in kernel.source
    compile_cuda(kernel.source, kernel.name, "sm_90a")


def test_the_unmasked_training_forward_takes_the_fused_kernel_and_is_proven():
    model = training_forward("tests/data/full_attention.habu", "FULL-ATTENTION", I=200, J=136)
    plan = default_plan(model, SM90, {})
    assert [(k.kind, k.nodes) for k in plan.kernels] == [("attention", ("R1", "R2", "O"))]
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations] or proof.certificate.failure


def _failure(model, plan) -> str:
    proof = prove(model, plan, {}, trials=1)
    assert not proof.ok
    return " ".join(o.describe() for o in proof.violations) or proof.certificate.failure


@pytest.mark.parametrize("loop", ["mma.sync", "wgmma"])
def test_planted_statistics_mistakes_fail_the_field_check(loop, monkeypatch):
    """The maximum and the sum swapped, stored one row off, and stored by two lanes of the row's four."""
    sizes, pins = ({"I": 300, "J": 300}, WGMMA) if loop == "wgmma" else ({}, {"family": "attention"})
    model = training_forward(**sizes)
    plan = default_plan(model, SM90, {}, pins)
    right = interp_attention.store_statistics

    def planted(kind):
        def store(name, lw, sizes, mem, coords, rows, lanes, m, l_run, where):
            if kind == "swapped":
                return right(name, lw, sizes, mem, coords, rows, lanes, l_run, m, where)
            return right(name, lw, sizes, mem, coords, rows + 1, lanes, m, l_run, where)
        return store

    for kind, says in (("swapped", "R1["), ("row-off", "R1[0, 0, 0, 0] was never written")):
        monkeypatch.setattr(interp_attention, "store_statistics", planted(kind))
        monkeypatch.setattr(interp_attention_wgmma, "store_statistics", planted(kind))
        assert says in _failure(model, plan), kind
    monkeypatch.undo()
    monkeypatch.setattr(AttentionLowering, "stat_writer", lambda self, lane: lane % 4 < 2)
    assert "times (a race between blocks" in _failure(model, plan)


def test_regression_the_scale_folded_into_the_exponent_would_store_the_raw_scores_maximum(monkeypatch):
    """The wgmma loop folds the scale into the exponent (its running max over the raw scores); a kernel storing
    the statistics must not (`scale_in_exponent`), or R1 is the raw scores' maximum: the check finds it."""
    model = training_forward(I=300, J=300)
    plan = default_plan(model, SM90, {}, WGMMA)
    monkeypatch.setattr(AttentionWgmmaLowering, "scale_in_exponent", lambda self, sizes: True)
    assert "R1[" in _failure(model, plan)


def test_split_kv_with_the_statistics_is_refused_by_a_rule():
    model = training_forward()
    plan = default_plan(model, SM90, {}, {"family": "attention"})
    split = replace(plan, kernels=(replace(plan.kernels[0], kv_split=64),))
    proof = prove(model, split, {}, trials=1)
    assert any("a kernel storing the row statistics runs each query tile" in o.describe() for o in proof.violations)
