"""What a row kernel cannot print is refused by the rules, by name, before the emitter sees it: the
emitter's former `ValueError`s (several rows per block without a warp per row, a cluster over a row of
runtime width or of blocks of one warp, prefetching a row not kept in registers) are the rows path's
`refusals` (habu/lower/support.py), which the rules state as `supported-path` obligations and the emitter
checks from the same list, so a proven plan is never refused by the emitter."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.lower import lower_whole
from habu.paths.emit import emit_lowered
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]


def _plan(example: str, model: str, sizes: dict[str, int], **fields):
    m = load_program(ROOT / "examples" / example).models[model]
    m = m.with_sizes(sizes) if sizes else m
    plan = default_plan(m, T, sizes or None)
    return m, replace(plan, kernels=(replace(plan.kernels[0], **fields),))


CASES = [
    # (what the emitter refused, example, model, sizes, kernel fields, the rules that refuse it)
    ("several rows per block of 64 threads", "softmax.habu", "SOFTMAX-ROWS", {"C": 4096},
     {"threads": 64, "rows_per_block": 2}, {"threads", "supported-path"}),
    ("a cluster over a row of runtime width", "rmsnorm.habu", "RMSNORM-ROWS", {},
     {"threads": 256, "cluster": 2}, {"supported-path"}),
    ("a cluster of one-warp blocks", "softmax.habu", "SOFTMAX-ROWS", {"C": 65536},
     {"threads": 32, "cluster": 2}, {"supported-path"}),
    ("a cluster whose parts are not whole vectors", "softmax.habu", "SOFTMAX-ROWS", {"C": 1000},
     {"threads": 128, "cluster": 2}, {"supported-path", "vector-align"}),
    ("prefetching a row kept in shared memory", "softmax.habu", "SOFTMAX-ROWS", {"C": 65536},
     {"threads": 1024, "cluster": 1, "prefetch": True}, {"supported-path"}),
    ("prefetching several rows per block", "softmax.habu", "SOFTMAX-ROWS", {"C": 4096},
     {"threads": 32, "rows_per_block": 4, "prefetch": True}, {"supported-path"}),
]


@pytest.mark.parametrize("what, example, model, sizes, fields, rules", CASES, ids=[c[0] for c in CASES])
def test_what_the_row_emitter_cannot_print_is_refused_by_a_named_rule(what, example, model, sizes, fields, rules):
    m, plan = _plan(example, model, sizes, **fields)
    proof = prove(m, plan, trials=1)
    assert not proof.ok and proof.certificate is None
    assert {o.rule.name for o in proof.violations} >= rules, [(o.rule.name, o.detail) for o in proof.violations]
    # the emitter checks the same list: handed the unproven lowering, it refuses with those reasons
    supported = [o.detail for o in proof.violations if o.rule.name == "supported-path"]
    with pytest.raises(ValueError) as refused:
        emit_lowered(lower_whole(m, plan), plan, T)
    assert any(part in str(refused.value) for d in supported for part in d.split("; "))


def test_the_row_plans_the_rules_accept_are_printed():
    """The other side: plans next to the refused ones (a warp per row with several rows, a cluster over a
    static row of whole vectors, a prefetching block with its row in registers) prove and print."""
    for example, model, sizes, fields in (
            ("softmax.habu", "SOFTMAX-ROWS", {"R": 64, "C": 1024}, {"threads": 32, "rows_per_block": 4}),
            ("softmax.habu", "SOFTMAX-ROWS", {"R": 64, "C": 65536}, {"threads": 512, "cluster": 2}),
            ("softmax.habu", "SOFTMAX-ROWS", {"R": 64, "C": 16384}, {"threads": 512, "cluster": 1, "prefetch": True})):
        m, plan = _plan(example, model, sizes, **fields)
        proof = prove(m, plan, trials=1)
        assert proof.ok, [(o.rule.name, o.detail) for o in proof.violations] or proof.certificate.failure
        assert emit_lowered(proof.lowered, plan, T).kernels


@pytest.mark.parametrize("example, model, sizes, fields", [
    ("softmax.habu", "SOFTMAX-ROWS", {"C": 65536}, {"threads": 32, "cluster": 2}),
    ("rmsnorm.habu", "RMSNORM-ROWS", {}, {"threads": 256, "cluster": 2}),
], ids=["one-warp-blocks", "runtime-width"])
def test_regression_a_row_cluster_the_rules_passed_was_refused_by_the_emitter(example, model, sizes, fields):
    """At 8406ead a cluster of one-warp blocks, and a cluster over RMSNorm's runtime-width row, broke no
    rule (`supported-path` asked only for a portable cluster size and one row per block) and the emitter
    then raised ValueError: a plan the rules accepted could not be built. Now `supported-path` refuses
    both, from the list the emitter checks."""
    from habu.prove.rules import failures, obligations

    m, plan = _plan(example, model, sizes, **fields)
    assert "supported-path" in {o.rule.name for o in failures(obligations(m, plan))}


@pytest.mark.parametrize(("example", "model", "key", "cluster"), [("softmax.habu", "SOFTMAX-ROWS", "C", 2),
                                                                   ("rmsnorm.habu", "RMSNORM-ROWS", "D", 4)])
def test_regression_a_prefetching_cluster_keeps_a_next_row_buffer_a_block(example, model, key, cluster):
    """The field check modelled one next-row buffer for a whole cluster (since commit 6141b83, which made it
    hold every kept row): the ranks' copies overwrote each other's and every prefetching cluster plan failed its
    proof (tests/gpu/test_golden.py's softmax-65536-cluster2 on the H200, session 42). Each block has its own."""
    sizes = {"R": 300, key: 16384}
    m = load_program(ROOT / "examples" / example).models[model].with_sizes(sizes)
    pins = {"threads": "512", "row_cluster": str(cluster), "row_prefetch": "true", "cache_row": "true"}
    plan = default_plan(m, TARGETS["sm_90a"], sizes, pins)
    assert plan.kernels[0].prefetch and plan.kernels[0].cluster == cluster
    proof = prove(m, plan, sizes, trials=1)
    assert proof.ok, proof.certificate.failure if proof.certificate else proof.violations
