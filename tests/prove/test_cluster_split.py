"""Cluster split-K (habu/lower/split_cluster.py): the split blocks of a tile are one thread-block cluster
and add their partial tiles in distributed shared memory, so the epilogue may be anything and the output
is not zeroed first. The rules, the refusals, the finite-field check's run of the reduction maps, the
printed kernel and the plan vocabulary."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from habu.lower import lower_whole
from habu.lower.contraction import ContractionLowering
from habu.prove.rules import failures, guards, obligations
from habu.prove.split_cluster import reduction_faults
from habu.search.space import default_plan
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

SPLIT4 = {"tile": "64x128x64", "stages": "4", "split_k": "4", "split_reduce": "cluster"}
SMALL = {"M": 100, "N": 300, "K": 1000}


def _model(example: str, name: str, sizes: dict[str, int]):
    return load_program(ROOT / "examples" / example).models[name].with_sizes(sizes)


def _rules(model, sizes, pins):
    plan = default_plan(model, TARGETS["sm_90a"], sizes, pins)
    return failures(obligations(model, plan, sizes)), plan


def test_a_cluster_split_ggemm_passes_the_rules_and_prints_one_cluster_per_tile_without_a_zero_fill():
    from habu.paths.emit import emit
    from habu.prove import prove

    model = _model("ggemm.habu", "GGEMM", SMALL)
    bad, plan = _rules(model, SMALL, SPLIT4)
    assert bad == [] and plan.kernels[0].split_reduce == "cluster"
    proof = prove(model, plan, SMALL, trials=1)
    assert proof.ok, proof.certificate
    (kernel,) = emit(proof, TARGETS["sm_90a"]).kernels
    assert "__cluster_dims__(4, 1, 1)" in kernel.source and kernel.cluster == 4
    assert kernel.zero == () and "atomic" not in kernel.source.split("extern \"C\"")[1]
    assert kernel.source.count("habu::cluster_sync()") == 4  # the producer's two, the consumers' two


def test_the_cluster_split_takes_a_nonlinear_epilogue_that_the_atomic_split_refuses():
    sizes = {"B": 16}
    model = _model("ffn_skip.habu", "FFN-SKIP", sizes)
    bad, _ = _rules(model, sizes, {**SPLIT4, "stages": "8"})
    assert bad == []
    bad, _ = _rules(model, sizes, {**SPLIT4, "stages": "8", "split_reduce": "atomic"})
    assert "split-k-linear" in {o.rule.name for o in bad}


@pytest.mark.parametrize("pins,reason", [
    ({"persistent": "true"}, "one tile per block"),
    ({"store": "tma"}, "store direct"),
    ({"split_k": "3"}, "a cluster split has 2, 4, 8 blocks"),
    ({"tile": "64x256x64", "stages": "1"}, "fits over the ring"),
    ({"mma": "mma.sync", "warps": "4"}, "warp-specialised wgmma path"),
])
def test_cluster_splits_are_refused_where_they_cannot_run(pins, reason):
    model = _model("ggemm.habu", "GGEMM", SMALL)
    bad, _ = _rules(model, SMALL, {**SPLIT4, **pins})
    assert any(o.rule.name == "supported-path" and reason in o.detail for o in bad), [o.detail for o in bad]


def test_a_decode_with_the_split_outermost_breaks_the_cluster_rank_rule():
    """The kernel reads rank r's partial as split r: a decode that puts the split outermost (the atomic
    split's order) gives a cluster's blocks different tiles, and z3 finds the block."""
    model = _model("ggemm.habu", "GGEMM", SMALL)
    plan = default_plan(model, TARGETS["sm_90a"], SMALL, SPLIT4)
    lowered = lower_whole(model, plan)
    lw = lowered.kernels[0]
    assert isinstance(lw, ContractionLowering)

    class SplitOutermost(ContractionLowering):
        def tile_of(self, linear, s, let=None):
            return ContractionLowering.tile_of(replace(self, split_mode="atomic"), linear, s, let)

    bad_lw = SplitOutermost(**{f.name: getattr(lw, f.name) for f in fields(lw)})
    obs = obligations(model, plan, SMALL, lowered=replace(lowered, kernels=(bad_lw,)))
    assert [o.rule.name for o in failures(obs)] == ["cluster-split-rank"]
    assert not failures(obligations(model, plan, SMALL, lowered=lowered))


def test_the_cluster_rank_rule_holds_at_every_runtime_m():
    src = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #M", "1..65536 EXTENT: #M")
    model = parse_text(src).models["GGEMM"]
    plan = default_plan(model, TARGETS["sm_90a"], None, SPLIT4)
    obs = obligations(model, plan)
    assert not failures(obs)
    rank = [o for o in obs if o.rule.name == "cluster-split-rank"]
    assert rank and rank[0] not in guards(obs) and rank[0].status == "proved"


def test_every_element_of_the_tile_is_reduced_once_at_every_split_and_width():
    from habu.lower.split_cluster import cluster_reduction_for

    for split in (2, 4, 8):
        for bm, bn, consumers in ((64, 16, 1), (64, 128, 1), (64, 256, 1), (128, 128, 2), (128, 256, 2)):
            assert reduction_faults(cluster_reduction_for(split, bm, bn, consumers)) == []


def test_a_plan_without_a_cluster_split_prints_no_split_reduce_field_in_json():
    model = _model("ggemm.habu", "GGEMM", SMALL)
    plain = default_plan(model, TARGETS["sm_90a"], SMALL)
    assert "split_reduce" not in plain.to_json()["kernels"][0]
    pinned = default_plan(model, TARGETS["sm_90a"], SMALL, SPLIT4)
    from habu.plan.plan import Plan

    assert Plan.from_json(pinned.to_json()) == pinned


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_the_search_space_of_a_skinny_layer_holds_cluster_splits():
    from habu.plan.patterns import default_regions
    from habu.search.space import concrete_sizes, region_space

    def space(example, name, sizes, region):
        bound = _model(example, name, sizes)
        regions = default_regions(bound)
        return {(v.tile_m, v.tile_n, v.split_k, v.split_reduce) for v in
                region_space(bound, regions[region], TARGETS["sm_90a"], concrete_sizes(bound, sizes))
                if getattr(v, "mma", None) == "wgmma"}

    down = space("ffn_skip.habu", "FFN-SKIP", {"B": 16}, 1)  # bias + residual epilogue, bf16 out
    assert (64, 128, 4, "cluster") in down and (64, 64, 2, "cluster") in down


def test_decode_defaults_split_by_a_cluster_of_two_where_the_h200_ran_them_faster():
    """H200, 2026-12-02 (habu.bench.decode_speed): GGEMM 64x4096x4096 and FFN-SKIP's down projection at
    16 tokens gained (16.3 against 19.5 µs, 82.5 against 86.3); RMSNorm+Linear at 16 tokens (32 k tiles
    a split) and FFN-SKIP at 128 tokens (128 rows) lost, and keep their unsplit tiles."""
    def contractions(example, name, sizes):
        plan = default_plan(_model(example, name, sizes), TARGETS["sm_90a"], sizes)
        return [(k.tile_m, k.tile_n, k.split_k, k.split_reduce if k.split_k > 1 else "-")
                for k in plan.kernels if hasattr(k, "tile_m")]

    assert contractions("ggemm.habu", "GGEMM", {"M": 64, "N": 4096, "K": 4096}) == [(64, 64, 2, "cluster")]
    # at 16 tokens the products run transposed (`swap_ab`: 128 or 64 weight rows by 16 tokens a tile)
    assert contractions("ffn_skip.habu", "FFN-SKIP", {"B": 16}) == [(128, 16, 1, "-"), (64, 16, 2, "cluster")]
    assert contractions("ffn_skip.habu", "FFN-SKIP", {"B": 128}) == [(128, 128, 1, "-"), (64, 64, 1, "-")]
    assert contractions("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 16}) == [(64, 16, 2, "cluster")]
    sm80 = default_plan(_model("ggemm.habu", "GGEMM", {"M": 64}), TARGETS["sm_80"], {"M": 64}).kernels[0]
    assert sm80.split_k == 1 or sm80.split_reduce == "atomic"  # no clusters before Hopper


SCATTER_SKINNY = """64 EXTENT: #M  4096 EXTENT: #N  4096 EXTENT: #K
bf16 TENSOR: G ( #M #N )
bf16 TENSOR: B ( #N #K )
f32 TENSOR: DA ( #M #K )
ITENSOR: IX ( #M #M )
MODEL: SCATTER  DA[IX[m] k] += Σ n G[m n] · B[n k] ;
"""


def test_regression_skinny_batched_and_scatter_add_defaults_take_no_cluster_split():
    """The rules refuse a cluster split on a batched contraction and on a scatter-add: a skinny default
    of either must not ask for one."""
    cases = [(_model("bmm.habu", "SCORES", {"B": 2, "I": 32, "J": 4096, "D": 4096}), {"B": 2, "I": 32, "J": 4096,
                                                                                     "D": 4096}),
             (parse_text(SCATTER_SKINNY).models["SCATTER"], {})]
    for model, sizes in cases:
        plan = default_plan(model, TARGETS["sm_90a"], sizes or None)
        assert all(getattr(k, "split_reduce", "atomic") == "atomic" or k.split_k == 1 for k in plan.kernels)
        assert not failures(obligations(model, plan, sizes or None)), model.name
