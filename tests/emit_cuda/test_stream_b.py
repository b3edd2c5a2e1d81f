"""`stream_b`: a wgmma product that streams its B (larger than the L2) once, whose A a later product of the plan
reads again, marks A's TMA loads evict-last and B's evict-first (habu/paths/l2_keep.py). A hint: the lowering sets
each load's `l2_hint`, the emitter prints the `_hinted` loads with the policy, and the field check is the same with
or without it. FFN-SKIP's 128-token backward takes it on dT2 = dT6·W2 and dX = dT2·W1 (dW2 reads dT6, dW1 dT2)."""

from __future__ import annotations

import json

import pytest

from habu.emit_cuda.nvrtc import _nvrtc, compile_cuda
from habu.lower import lower_whole
from habu.paths.emit import emit_plan
from habu.paths.l2_keep import streams_b
from habu.plan.plan import Plan
from habu.plan.rewrite import apply_rewrites
from habu.prove import prove
from habu.prove.verify import field_key
from habu.search.space import concrete_sizes, default_plan
from tests.conftest import ROOT
from tests.emit_cuda.test_keep_operands import T, _ffn


def _streamed(plan) -> list[str]:
    return [k.nodes[0] for k in plan.kernels if getattr(k, "stream_b", False)]


def test_the_128_token_backward_streams_the_weights_of_its_two_input_gradient_products():
    assert _streamed(default_plan(_ffn(True, 128), T, {})) == ["%d3", "%rdX"]


def test_the_forward_and_the_4096_token_layer_keep_plain_loads():
    """The forward's products: no later product reads their activations (the residual's row kernel reading X does
    not count); at 4096 tokens A is 117 MB too, past a quarter of the L2."""
    assert _streamed(default_plan(_ffn(False, 128), T, {})) == []
    assert _streamed(default_plan(_ffn(True, 4096), T, {})) == []
    assert _streamed(default_plan(_ffn(False, 4096), T, {})) == []


def test_the_examples_forward_whose_x_the_second_products_epilogue_reads_keeps_plain_loads():
    """examples/ffn_skip.habu's own forward fuses the residual (+ X) into the second product's epilogue: an
    epilogue's read of A is not a product multiplying it again (regression: the first rule counted any read)."""
    from habu.spec.parser import load_program

    model = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"]
    assert _streamed(default_plan(model, T, {})) == []


def test_a_row_kernel_reading_a_does_not_count_and_a_later_product_does():
    model = _ffn(False, 128)
    plan = default_plan(model, T, {})
    model = apply_rewrites(model, plan.rewrites)  # the graph the plan's kernels compute
    assert not streams_b(model, plan.kernels, 0, T, concrete_sizes(model, {}))  # X: read later by the residual's row kernel only
    back = _ffn(True, 128)
    plan = default_plan(back, T, {})
    back = apply_rewrites(back, plan.rewrites)
    i = next(j for j, k in enumerate(plan.kernels) if k.nodes[0] == "%d3")
    assert streams_b(back, plan.kernels, i, T, concrete_sizes(back, {}))
    assert not streams_b(back, plan.kernels[:i + 1], i, T, concrete_sizes(back, {}))  # without dW2 after it: nothing reads dT6 again


def test_the_lowering_marks_a_last_and_b_first_and_the_emitter_prints_both_policies():
    model = _ffn(True, 128)
    plan = default_plan(model, T, {})
    i = next(j for j, k in enumerate(plan.kernels) if k.nodes[0] == "%d3")
    ring = lower_whole(model, plan).kernels[i].pipeline
    assert [(ld.side, ld.l2_hint) for ld in ring.loads] == [("A", "evict_last"), ("B", "evict_first")]
    kernel = emit_plan(model, plan, T).kernels[i]
    a = sum(ld.boxes for ld in ring.loads if ld.side == "A")
    b = sum(ld.boxes for ld in ring.loads if ld.side == "B")
    assert kernel.source.count("habu::l2_policy_evict_last())") == a
    assert kernel.source.count("habu::l2_policy_evict_first())") == b
    assert "habu::tma_load_2d(" not in kernel.source
    if _nvrtc() is not None:
        assert not compile_cuda(kernel.source, kernel.name, "sm_90a").resources.spills


def test_a_multicast_b_keeps_plain_loads():
    model = _ffn(True, 128)
    plan = default_plan(model, T, {}, {"cluster": "2", "stream_b": "true"})
    i = next(j for j, k in enumerate(plan.kernels) if k.nodes[0] == "%d3")
    assert plan.kernels[i].cluster_m == 2 and plan.kernels[i].stream_b
    ring = lower_whole(model, plan).kernels[i].pipeline
    assert [(ld.side, bool(ld.mask), ld.l2_hint) for ld in ring.loads] == [("A", False, "evict_last"),
                                                                           ("B", True, "")]


@pytest.mark.parametrize("value", ["true", "false"])
def test_the_pin_sets_it_and_the_plan_is_proven_with_the_same_field_check(value):
    model = _ffn(True, 128)
    plan = default_plan(model, T, {}, {"stream_b": value})
    assert [getattr(k, "stream_b", None) for k in plan.kernels if k.kind == "contraction"] == [value == "true"] * 4
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations]
    assert field_key(model, plan, {}) == field_key(model, default_plan(model, T, {}), {})  # no value depends on it
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_stream_b_wins_over_keep_operands_on_b():
    model = _ffn(True, 128)
    plan = default_plan(model, T, {}, {"stream_b": "true", "keep_operands": "true"})
    i = next(j for j, k in enumerate(plan.kernels) if k.nodes[0] == "dW2")
    ring = lower_whole(model, plan).kernels[i].pipeline
    assert [(ld.side, ld.l2_hint) for ld in ring.loads] == [("A", "evict_last"), ("B", "evict_first")]


def test_a_batched_product_pinned_proves_and_compiles():
    from habu.spec.parser import load_program

    model = load_program(ROOT / "examples" / "bmm.habu").models["SCORES"]
    plan = default_plan(model, T, {}, {"stream_b": "true"})
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() for o in proof.violations]
    hinted = [k for k in emit_plan(model, plan, T).kernels if "l2_policy_evict_first()" in k.source]
    assert hinted and all("tma_load_3d_hinted(" in k.source for k in hinted)
    if _nvrtc() is not None:
        for k in hinted:
            assert not compile_cuda(k.source, k.name, "sm_90a").resources.spills
