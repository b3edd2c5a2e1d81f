"""Causal grouped-query attention through the general family: conditions on indices, where and −∞ are
lowered, emitted, interpreted over GF(p) and proven; a plan with the wrong comparison is rejected."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.errors import HabuError
from habu.lower import lower_plan
from habu.paths.emit import emit_plan
from habu.prove.rules import failures, obligations
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.ir import Compare, Op, Reduce, walk
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

ATTENTION = ROOT / "tests" / "data" / "attention"
SMALL = {"B": 1, "H": 4, "G": 2, "I": 3, "J": 7, "E": 4, "D": 3}


def small_prefill():
    return load_program(ATTENTION / "attention.habu").models["ATTENTION-GQA"].with_sizes(SMALL)


def test_the_default_plan_is_proven_and_its_source_tests_the_mask():
    model = small_prefill()
    plan = default_plan(model, TARGETS["sm_90a"], SMALL)
    assert not failures(obligations(model, plan, SMALL))
    cert = verify_plan(model, plan, SMALL, trials=1)
    assert cert.passed, cert.failure
    src = "\n".join(k.source for k in emit_plan(model, plan, TARGETS["sm_90a"]).kernels)
    assert "<= (1 * (long long)e2 + 1 * (long long)(7) + -1 * (long long)(3) + 0LL)" in src
    assert "(-__int_as_float(0x7f800000))" in src


def _flip(e):
    return Compare("lt", e.left, e.right) if isinstance(e, Compare) else e


def test_a_plan_with_the_wrong_comparison_is_rejected():
    """j < i + #J − #I instead of ≤: the last visible key of every row is dropped."""
    model = small_prefill()
    plan = default_plan(model, TARGETS["sm_90a"], SMALL)
    lowerings = lower_plan(model, plan)
    from habu.spec.ir import map_ops

    def leaf(x):
        if isinstance(x, Reduce):
            return Reduce(x.op, x.vars, map_ops(x.body, leaf))
        return _flip(x)

    flipped = 0
    for at, lw in enumerate(lowerings):  # every kernel that tests the mask (the unfused plan's several)
        node = getattr(lw, "node", None)
        if node is None or not any(isinstance(x, Compare) for x in walk(node.rhs)):
            continue
        rhs = map_ops(node.rhs, leaf)
        assert any(isinstance(x, Compare) and x.op == "lt" for x in walk(rhs) if not isinstance(x, Op))
        lowerings[at] = replace(lw, node=replace(node, rhs=rhs))
        flipped += 1
    assert flipped
    cert = verify_plan(model, plan, SMALL, trials=1, lowerings=lowerings)
    assert not cert.passed and "O[" in (cert.failure or "")


def test_a_condition_through_an_index_tensor_reads_it_in_the_kernel():
    """j < LEN[b]: the kernel reads LEN at its coordinate of #B (in bounds by the types). An empty
    sequence (LEN[b] = 0) is proven since its softmax divides with div0 (tests/plan/test_attention_split.py)."""
    model = load_program(ATTENTION / "decode_attention.habu").models["DECODE-ATTENTION"]
    sizes = {"B": 2, "H": 2, "G": 1, "J": 7, "L": 8, "E": 2, "D": 2}
    model = model.with_sizes(sizes)
    plan = default_plan(model, TARGETS["sm_90a"], sizes)
    assert not failures(obligations(model, plan, sizes))
    src = "\n".join(k.source for k in emit_plan(model, plan, TARGETS["sm_90a"]).kernels)
    assert "(long long)(int)p_LEN[e0]" in src


def test_nested_gathers_in_a_condition_are_refused_cleanly():
    text = (ATTENTION / "decode_attention.habu").read_text().replace("j < LEN[b]", "j < LEN[H2G[b]]") \
        .replace("ITENSOR: H2G ( #H #G )", "ITENSOR: H2G ( #H #G )  ITENSOR: B2B ( #B #B )") \
        .replace("LEN[H2G[b]]", "LEN[B2B[b]]")
    from habu.spec.parser import parse_text

    model = parse_text(text, "d.habu").models["DECODE-ATTENTION"]
    sizes = {"B": 2, "H": 2, "G": 1, "J": 7, "L": 8, "E": 2, "D": 2}
    model = model.with_sizes(sizes)
    with pytest.raises(HabuError, match="several or nested indices"):
        lower_plan(model, default_plan(model, TARGETS["sm_90a"], sizes))
