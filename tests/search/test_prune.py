"""The search's cheap filter: the structural rules decide ground z3 facts, and the memory of
operand-local failures prunes exactly what the rules would."""

from __future__ import annotations

import itertools

import pytest

from habu.db import PlanDB
from habu.plan.patterns import default_regions
from habu.prove.rules import quick_reject
from habu.search.loop import Budget, Search
from habu.search.pool import InlineExecutor
from habu.search.prune import QuickPruner
from habu.search.space import make_plan, region_space
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.search.test_search import model_of

GGEMM = ROOT / "examples" / "ggemm.habu"


@pytest.mark.parametrize("sizes", [{"M": 1024, "N": 1024, "K": 511}, {"M": 4096, "N": 4096, "K": 4096}],
                         ids=["K511", "4096"])
def test_the_memory_prunes_what_the_rules_reject_and_nothing_else(sizes):
    model, sizes = model_of(GGEMM, sizes)
    target = TARGETS["sm_90a"]
    fixed = {e.name: e.size for e in model.extents}
    region = default_regions(model)[0]
    kernels = list(itertools.islice(region_space(model, region, target, fixed), 0, None, 23))[:2500]
    pruner = QuickPruner(model, fixed)
    for k in kernels:
        plan = make_plan(model, target, (k,), fixed)
        remembered = pruner.remembered
        got = pruner.reject(plan)
        truth = quick_reject(model, plan, fixed)
        assert (got is None) == (truth is None), k
        if pruner.remembered > remembered:  # pruned from memory: the rule still rejects it
            assert truth is not None, k
    if sizes["K"] == 511:
        assert pruner.remembered > 0


def test_regression_quick_reject_left_a_ground_tma_stride_to_the_solver():
    """At K = 511 a TMA descriptor over B has a 1022-byte row stride. The stride rule's formula is
    a z3 term even at a fixed shape, so the quick filter skipped it and every such candidate went
    to the full z3 check (3502 candidates, 44 ms each, for a 6-trial search)."""
    model, _sizes = model_of(GGEMM, {"M": 1024, "N": 1024, "K": 511})
    target = TARGETS["sm_90a"]
    fixed = {e.name: e.size for e in model.extents}
    region = default_regions(model)[0]
    k = next(k for k in region_space(model, region, target, fixed) if k.b_move == "tma" and k.a_move == "staged")
    ob = quick_reject(model, make_plan(model, target, (k,), fixed), fixed)
    assert ob is not None and ob.rule.name == "tma-stride-16B" and ob.tensor == "B"


def test_regression_a_trials_search_at_k511_sent_thousands_of_doomed_candidates(tmp_path):
    model, sizes = model_of(GGEMM, {"M": 1024, "N": 1024, "K": 511})
    with PlanDB(tmp_path / "db.sqlite") as db:
        search = Search(str(GGEMM), model, TARGETS["sm_90a"], sizes, db, Budget(trials=6),
                        executor=InlineExecutor())
        result = search.run()
    assert result.stats.verified == 6
    assert search.sequence <= 3 * result.stats.verified  # sent to the full check: nearly all prove
