"""The two-lane schedule (habu/plan/lanes.py): every pair of kernels that share a tensor keeps its order, the
FFN-SKIP backward's weight gradients run beside the products that read the weights, and the pin says when a
plan has nothing to run side by side."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from habu.errors import UsageError
from habu.plan.lanes import LaneStep, lane_schedule, plan_accesses, schedule_faults
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import target_named
from tests.conftest import ROOT

TENSORS = "ABCDEF"


def access(reads: str, writes: str) -> tuple[frozenset[str], frozenset[str]]:
    return frozenset(reads), frozenset(writes)


@st.composite
def plans(draw) -> list[tuple[frozenset[str], frozenset[str]]]:
    n = draw(st.integers(1, 7))
    return [access(draw(st.text(TENSORS, max_size=3)), draw(st.text(TENSORS, max_size=2))) for _ in range(n)]


@settings(max_examples=300, deadline=None)
@given(plans())
def test_every_conflicting_pair_keeps_its_order(accesses):
    schedule = lane_schedule(accesses)
    assert schedule_faults(accesses, schedule) == []


def test_a_missing_wait_is_a_fault():
    # k0 writes T; k1 (side lane, beside nothing) reads it: it must wait for k0's event
    accesses = [access("A", "T"), access("B", "U"), access("T", "C")]
    schedule = lane_schedule(accesses)
    assert [(s.launch, s.lane) for s in schedule] == [(0, 0), (1, 1), (2, 0)]
    broken = (LaneStep(0, 0), LaneStep(1, 1), LaneStep(2, 1))  # k2 moved to the side lane without k0's event
    faults = schedule_faults(accesses, broken)
    assert faults == ["launch 2 may start before launch 0 completes, and they share a tensor (T)"]
    assert schedule_faults(accesses, (LaneStep(0, 0), LaneStep(2, 1, (0,)), LaneStep(1, 1))) == []


def test_a_launch_issued_twice_or_never_is_a_fault():
    accesses = [access("A", "T"), access("T", "C")]
    assert "not each of 0..1 once" in schedule_faults(accesses, (LaneStep(0, 0), LaneStep(0, 0)))[0]


def test_a_write_after_a_read_keeps_its_order():
    # k1 overwrites what k0 reads: k1 may not start first
    accesses = [access("T", "C"), access("A", "T")]
    assert [s.lane for s in lane_schedule(accesses)] == [0, 0]


def ffn_backward(tokens: int = 128):
    program = load_program(ROOT / "examples" / "ffn_skip.habu")
    bw = derive_model(program, "FFN-SKIP")
    return bw.model, {"B": tokens, "D": 4096, "H": 14336}


def test_the_ffn_backward_runs_its_weight_gradients_beside_the_weights_products():
    model, sizes = ffn_backward()
    plan = default_plan(model, target_named("sm_90a"), sizes, {"lanes": "2"})
    assert plan.lanes == 2 and plan.to_json()["lanes"] == 2
    from habu.plan.rewrite import apply_rewrites

    graph = apply_rewrites(model, plan.rewrites)
    schedule = {s.launch: s for s in lane_schedule(plan_accesses(graph, plan.kernels))}

    def step(node: str) -> tuple[int, tuple[int, ...]]:
        s = schedule[next(i for i, k in enumerate(plan.kernels) if node in k.nodes)]
        return s.lane, s.waits

    assert step("dW2") == (1, (0,))  # beside dT3's product (after dT6's row kernel, kernel 0)
    assert step("dB1") == (0, ()) and step("dX") == (0, ())
    assert step("dW1") == (1, (1,))  # beside dX, after dT2's product


def test_the_default_is_one_lane_and_its_json_unchanged():
    model, sizes = ffn_backward()
    plan = default_plan(model, target_named("sm_90a"), sizes)
    assert plan.lanes == 1 and "lanes" not in plan.to_json()


def test_lanes_2_on_a_chain_is_refused():
    program = load_program(ROOT / "examples" / "ffn_skip.habu")
    with pytest.raises(UsageError, match="nothing can run beside another"):
        default_plan(program.models["FFN-SKIP"], target_named("sm_90a"), {"B": 128, "D": 4096, "H": 14336},
                     {"lanes": "2"})


def test_lanes_3_is_refused():
    model, sizes = ffn_backward()
    with pytest.raises(UsageError, match="expected 1 or 2"):
        default_plan(model, target_named("sm_90a"), sizes, {"lanes": "3"})
