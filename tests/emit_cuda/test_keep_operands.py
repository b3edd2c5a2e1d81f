"""`keep_operands`: a wgmma product's operand loads marked evict-last in the L2 (habu/paths/l2_keep.py), so a
stream of output larger than the L2 does not evict the small operands that every tile re-reads. A hint: the
lowering marks the loads (`TmaOperandLoad.l2_hint`), the emitter prints their `_hinted` form with the policy, and
the field check is the same with or without it."""

from __future__ import annotations

import json

import pytest

from habu.emit_cuda.nvrtc import _nvrtc, compile_cuda
from habu.lower import lower_whole
from habu.paths.emit import emit_plan
from habu.plan.plan import Plan
from habu.prove import prove
from habu.prove.verify import field_key
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]


def _ffn(backward: bool, tokens: int):
    bw = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP")
    return (bw.model if backward else bw.forward).with_sizes({"B": tokens})


def _kept(plan) -> list[str]:
    return [k.nodes[0] for k in plan.kernels if getattr(k, "keep_operands", False)]


def test_the_128_token_weight_gradients_keep_their_operands_and_nothing_else_does():
    """dW1 and dW2 write 117 MB (past the 60 MiB L2) from 1-4 MB operands; the other products stream their
    weights (as large as their output or larger), and at 4096 tokens the operands are 117 MB too."""
    assert _kept(default_plan(_ffn(True, 128), T, {})) == ["dW1", "dW2"]
    assert _kept(default_plan(_ffn(False, 128), T, {})) == []
    assert _kept(default_plan(_ffn(True, 4096), T, {})) == []


def test_the_lowering_marks_each_blocks_own_loads_and_the_emitter_prints_them():
    model = _ffn(True, 128)
    plan = default_plan(model, T, {})
    i = next(j for j, k in enumerate(plan.kernels) if k.nodes == ("dW2",))
    ring = lower_whole(model, plan).kernels[i].pipeline
    assert [(ld.side, ld.l2_hint) for ld in ring.loads] == [("A", "evict_last"), ("B", "evict_last")]
    src = emit_plan(model, plan, T).kernels[i].source
    boxes = sum(ld.boxes for ld in ring.loads)
    assert src.count("habu::tma_load_2d_hinted(") == boxes and "habu::tma_load_2d(" not in src
    assert src.count("habu::l2_policy_evict_last())") == boxes
    if _nvrtc() is not None:
        res = compile_cuda(src, emit_plan(model, plan, T).kernels[i].name, "sm_90a").resources
        assert not res.spills, res.describe()


def test_a_multicast_operand_keeps_plain_loads():
    """In a cluster B's boxes are multicast (one block issues each for all): those loads stay unhinted."""
    model = _ffn(True, 128)
    plan = default_plan(model, T, {}, {"cluster": "2"})
    i = next(j for j, k in enumerate(plan.kernels) if k.nodes == ("dW2",))
    assert plan.kernels[i].keep_operands and plan.kernels[i].cluster_m == 2
    ring = lower_whole(model, plan).kernels[i].pipeline
    assert [(ld.side, bool(ld.mask), ld.l2_hint) for ld in ring.loads] == [("A", False, "evict_last"),
                                                                           ("B", True, "")]
    src = emit_plan(model, plan, T).kernels[i].source
    assert "habu::tma_load_2d_hinted(a_stage" in src and "tma_load_2d_multicast(" in src


@pytest.mark.parametrize("value", ["true", "false"])
def test_the_pin_sets_it_and_the_plan_is_proven_with_the_same_field_check(value):
    model = _ffn(True, 128)
    plan = default_plan(model, T, {}, {"keep_operands": value})
    assert [getattr(k, "keep_operands", None) for k in plan.kernels if k.kind == "contraction"] == [value == "true"] * 4
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations]
    assert field_key(model, plan, {}) == field_key(model, default_plan(model, T, {}), {})  # no value depends on it
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan


@pytest.mark.parametrize("path, name", [("bmm.habu", "SCORES"), ("ggemm.habu", "GGEMM"), ("accumulate.habu", "GEMM-ACC")])
def test_pinned_on_batched_gathered_and_accumulating_products_it_proves_and_compiles(path, name):
    """The hint on each kind of TMA operand load the wgmma path prints (a batched operand's 3-D map, a gathered
    operand's staged or plain rows, C += A·B): proven, printed in the `_hinted` form, compiled."""
    model = load_program(ROOT / "examples" / path).models[name]
    plan = default_plan(model, T, {}, {"keep_operands": "true"})
    assert any(getattr(k, "keep_operands", False) for k in plan.kernels)
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations]
    hinted = [k for k in emit_plan(model, plan, T).kernels if "l2_policy_evict_last()" in k.source]
    assert hinted
    if _nvrtc() is not None:
        for k in hinted:
            assert not compile_cuda(k.source, k.name, "sm_90a").resources.spills
