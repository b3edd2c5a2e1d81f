"""The search's first plan is the one `habu compile` makes (habu/search/seed.py): the families' default choices,
the rewrites and the fused pair, with a region for each of its kernels."""

from __future__ import annotations

import pytest

from habu.db import PlanDB
from habu.paths import region_space
from habu.plan.patterns import Region
from habu.plan.plan import GroupedKernel
from habu.search.loop import Budget, Search
from habu.search.seed import aligned_regions, search_seed
from habu.search.space import concrete_sizes, default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
MOE = ROOT / "examples" / "moe_mixtral.habu"
SIZES = {"T": 64, "R": 128}


def _forward():
    return load_program(MOE).models["MOE-FFN"].with_sizes(SIZES)


def test_regression_the_search_starts_from_the_plan_habu_compile_makes(tmp_path):
    """The search began from each region's analytic default (`default_kernels`): for the Mixtral layer its grouped
    GEMMs on the mma.sync loop, gate and up apart; for the derived backward every expert product a general kernel
    (predicted 2.5·10^9 µs at 512 tokens), so a 90-second search on the CPU stored a plan predicted at 792 ms where
    compile's is predicted at 6.8 ms.
    A one-candidate search now verifies and stores compile's plan."""
    model = _forward()
    compiled = default_plan(model, TARGET, SIZES)
    assert any(isinstance(k, GroupedKernel) and k.main_loop == "wgmma" and len(k.nodes) == 3 for k in compiled.kernels)
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(MOE), model, TARGET, SIZES, db, Budget(trials=1)).run()
    assert result.best is not None and result.best.kernels == compiled.kernels
    assert result.best.rewrites == compiled.rewrites


def test_the_fused_pairs_region_holds_its_three_nodes_and_has_variants():
    model = _forward()
    seed = search_seed(model, TARGET, SIZES)
    assert seed.kernels == default_plan(model, TARGET, SIZES).kernels
    assert [r.nodes for r in seed.regions] == [k.nodes for k in seed.kernels]
    (pair,) = [r for r in seed.regions if len(r.nodes) == 3]
    assert pair.kind == "grouped"
    variants = list(region_space(seed.graph, pair, TARGET, concrete_sizes(model, SIZES)))
    assert variants and all(isinstance(k, GroupedKernel) and k.nodes == pair.nodes for k in variants)
    assert any(k.main_loop == "wgmma" for k in variants) and any(k.main_loop == "mma.sync" for k in variants)


def test_the_backwards_seed_has_compiles_rewrites_and_kernels():
    backward = derive_model(load_program(MOE), "MOE-FFN").model.with_sizes(SIZES)
    seed = search_seed(backward, TARGET, SIZES)
    compiled = default_plan(backward, TARGET, SIZES)
    assert seed.rewrites == compiled.rewrites and seed.rewrites  # terms:dX, inner:dP
    assert seed.kernels == compiled.kernels
    assert sum(isinstance(k, GroupedKernel) and k.main_loop == "wgmma" for k in seed.kernels) >= 5


@pytest.mark.parametrize(("kernels", "aligned"), [
    ((("a",), ("b", "c"), ("d",)), True),
    ((("a", "b"), ("c",), ("d",)), True),  # a kernel of two consecutive regions' nodes
    ((("a",), ("c", "b"), ("d",)), False),  # not in the partition's order
    ((("a",), ("b", "c")), False),  # a region no kernel computes
])
def test_kernels_align_with_the_partitions_regions_or_the_seed_falls_back(kernels, aligned):
    parts = (Region("rows", ("a",)), Region("map", ("b",)), Region("map", ("c",)), Region("rows", ("d",)))

    class K:
        def __init__(self, nodes):
            self.nodes = nodes

    got = aligned_regions(parts, tuple(K(n) for n in kernels))
    assert (got is not None) == aligned
    if aligned:
        assert [r.nodes for r in got] == [tuple(n) for n in kernels]
