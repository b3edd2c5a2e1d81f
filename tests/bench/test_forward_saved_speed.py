"""The RMSNorm forward-with-rstd benchmark's plans, on the CPU: the fused default and the split baseline it
times against are both proven (the timing itself runs on the GPU: docs/GPU_PENDING.md)."""

from __future__ import annotations

from habu.bench.forward_saved_speed import forward_model, split_plan
from habu.prove import prove
from habu.search.space import default_plan
from habu.target import TARGETS


def test_the_benchmarks_fused_and_split_plans_are_proven():
    sizes = {"R": 6, "D": 1000}
    model = forward_model().with_sizes(sizes)
    fused = default_plan(model, TARGETS["sm_90a"], sizes, {})
    split = split_plan(model, TARGETS["sm_90a"], sizes)
    assert [k.nodes for k in fused.kernels] == [("R1", "Y")]
    assert [k.nodes for k in split.kernels] == [("R1",), ("Y",)]
    for plan in (fused, split):
        proof = prove(model, plan, trials=1)
        assert proof.certificate is not None and proof.certificate.passed, proof.certificate
