"""`--pin storage=bf16` (habu/plan/storage_pin.py): the matrices a plan stores between kernels in bf16 where the
model's rule keeps f32 (a derived MoE backward's cotangents, f32 because its incoming gradient is): pinned only,
never offered by the search, proven like any plan."""

from __future__ import annotations

import pytest

from habu.errors import UsageError
from habu.lower import lower_plan
from habu.plan.rewrite import applicable, rewrite_sets
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
SHAPE = {"T": 13, "R": 26}


@pytest.fixture(scope="module")
def backward():
    return derive_model(load_program(ROOT / "tests" / "data" / "moe_small.habu"), "MOE-FFN").model.with_sizes(SHAPE)


def test_the_pinned_storage_stores_the_cotangents_in_bf16_and_is_proven(backward):
    plain = default_plan(backward, TARGET, SHAPE, {})
    assert set(dict(plain.storage).values()) == {"f32"}
    plan = default_plan(backward, TARGET, SHAPE, {"storage": "bf16"})
    assert plan.rewrites == (*plain.rewrites, "storage:bf16")
    assert set(dict(plan.storage).values()) == {"bf16"}
    a_types = {k.nodes[0]: lw.a.dtype for k, lw in zip(plan.kernels, lower_plan(backward, plan), strict=True)
               if k.kind == "grouped"}
    assert a_types["dX.t0"] == a_types["dW1"] == "bf16"  # the products read bf16 cotangents
    # the f32 input dY reaches the products through its bf16 copy, the first kernel; dY_in (its copy) keeps f32
    assert plan.kernels[0].nodes == ("dY.bf16",) and a_types["dW2"] == a_types["%dact"] == "bf16"
    lowered = dict(zip((k.nodes[0] for k in plan.kernels), lower_plan(backward, plan), strict=True))
    assert lowered["dW2"].a.tensor == "dY.bf16" and "dY" in {a.tensor for _, a in lowered["dY_in"].loads}
    proof = prove(backward, plan, SHAPE, trials=1)
    assert proof.ok, ([o.detail for o in proof.violations], proof.certificate and proof.certificate.failure)


def test_the_storage_pin_is_never_offered_by_node_or_by_the_search(backward):
    assert not [r for r in applicable(backward) if r.startswith("storage:")]
    assert not [s for s in rewrite_sets(backward) if any(r.startswith("storage:") for r in s)]


def test_a_storage_pin_that_cannot_apply_is_a_usage_error(backward):
    with pytest.raises(UsageError, match=r"--pin storage=f32: expected one of bf16, f16"):
        default_plan(backward, TARGET, SHAPE, {"storage": "f32"})
    ggemm = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    with pytest.raises(UsageError, match=r"--pin storage=bf16: the plan of GGEMM stores no matrix in another type"):
        default_plan(ggemm, TARGET, {}, {"storage": "bf16"})
