"""Plans: frozen, hashable, JSON round trip, clear errors for bad plan files."""

from __future__ import annotations

import json

import pytest

from habu.errors import HabuError
from habu.plan.plan import Plan, field_docs
from habu.search.space import default_plan, enumerate_plans, parse_pins
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import EXAMPLES, ROOT


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_json_round_trip_and_hash(path):
    for m in load_program(path).models.values():
        plan = default_plan(m, TARGETS["sm_90a"])
        again = Plan.from_json(json.loads(plan.dumps()))
        assert again == plan and hash(again) == hash(plan) and again.key == plan.key
        with pytest.raises(AttributeError):
            plan.kernels[0].nodes = ()  # type: ignore[misc]


def test_every_field_has_a_doc_line():
    m = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"]
    plan = default_plan(m, TARGETS["sm_90a"])
    for obj in (plan, *plan.kernels):
        for name, _value, doc in field_docs(obj):
            assert doc, f"{type(obj).__name__}.{name} has no doc"


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.pop("kernels"), "missing field 'kernels'"),
    (lambda d: d["kernels"][0].update(tile_m="big"), "tile_m must be an integer"),
    (lambda d: d["kernels"][0].update(kind="magic"), "unknown kind 'magic'"),
    (lambda d: d["kernels"][0].update(extra=1), "unknown field(s) extra"),
    (lambda d: d.update(format=99), "unknown plan format"),
])
def test_bad_plan_files_give_clear_errors(edit, fragment):
    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    data = default_plan(m, TARGETS["sm_90a"]).to_json()
    edit(data)
    with pytest.raises(HabuError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Plan.from_json(data, "p.json")


def test_enumeration_is_canonical_and_has_no_duplicates():
    m = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"]
    import itertools

    a = list(itertools.islice(enumerate_plans(m, TARGETS["sm_90a"]), 3000))
    b = list(itertools.islice(enumerate_plans(m, TARGETS["sm_90a"]), 3000))
    assert a == b
    assert len(set(a)) == len(a)


def test_pins_apply_and_bad_pins_are_clear():
    m = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    plan = default_plan(m, TARGETS["sm_90a"], None, parse_pins(["tile=64x256x32", "mma=mma.sync", "stages=3",
                                                               "B=cp.async", "split_k=2", "persistent=true"]))
    k = plan.kernels[0]
    assert (k.tile_m, k.tile_n, k.tile_k, k.mma, k.stages, k.b_move, k.split_k, k.persistent) == \
        (64, 256, 32, "mma.sync", 3, "cp.async", 2, True)
    from habu.errors import UsageError

    for bad in (["tile=12"], ["mma=tensorcore"], ["B=teleport"], ["stages=many"], ["frob=1"], ["nokey"]):
        with pytest.raises(UsageError):
            default_plan(m, TARGETS["sm_90a"], None, parse_pins(bad))


def test_a_plan_with_register_stores_keeps_its_key_from_before_the_store_field():
    """`store` defaults to direct and is left out of the JSON then, so stored plans and their keys
    from before the field are still the same plans."""
    from habu.plan.plan import Plan
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    direct = default_plan(m, TARGETS["sm_90a"], None, {"store": "direct"})
    tma = default_plan(m, TARGETS["sm_90a"], None, {"store": "tma"})
    assert "store" not in direct.to_json()["kernels"][0]
    assert tma.to_json()["kernels"][0]["store"] == "tma"
    assert Plan.from_json(tma.to_json()) == tma and tma.key != direct.key
    old = direct.to_json()
    assert Plan.from_json(old).kernels[0].store == "direct"


def test_a_plan_without_a_cluster_keeps_its_key_from_before_the_cluster_field():
    from habu.errors import UsageError
    from habu.plan.plan import Plan

    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    plain = default_plan(m, TARGETS["sm_90a"], None, {})
    pair = default_plan(m, TARGETS["sm_90a"], None, parse_pins(["cluster=2"]))
    assert "cluster_m" not in plain.to_json()["kernels"][0]
    assert pair.to_json()["kernels"][0]["cluster_m"] == 2 and pair.key != plain.key
    assert Plan.from_json(pair.to_json()) == pair
    with pytest.raises(UsageError, match="cluster=3"):
        default_plan(m, TARGETS["sm_90a"], None, parse_pins(["cluster=3"]))


def test_a_row_kernel_without_prefetch_keeps_its_key_from_before_the_prefetch_field():
    from habu.plan.plan import Plan

    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"].with_sizes({"C": 16384})
    plain = default_plan(m, TARGETS["sm_90a"], {"C": 16384}, {})
    ahead = default_plan(m, TARGETS["sm_90a"], {"C": 16384}, parse_pins(["row_prefetch=true"]))
    assert "prefetch" not in plain.to_json()["kernels"][0]
    assert ahead.to_json()["kernels"][0]["prefetch"] is True and ahead.key != plain.key
    assert Plan.from_json(ahead.to_json()) == ahead


def test_a_skinny_problem_gets_wgmma_tiles_that_cover_half_the_sms():
    """FFN-SKIP at 128 tokens: 128x128 tiles gave its second GEMM (128x4096, K 14336) 32 blocks on
    132 SMs (113 µs on the H200, the expert 99); narrower, then shorter tiles cover half the SMs."""
    m = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"]
    first, second, _norm = default_plan(m, TARGETS["sm_90a"]).kernels
    assert (first.tile_m, first.tile_n, first.warps, first.stages) == (128, 128, 12, 5)  # 112 tiles
    assert (second.tile_m, second.tile_n, second.warps, second.stages) == (64, 64, 8, 6)  # 128 tiles
    ggemm = default_plan(load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"], TARGETS["sm_90a"])
    assert (ggemm.kernels[0].tile_m, ggemm.kernels[0].tile_n) == (128, 256)  # a large problem keeps them


def test_a_pinned_wgmma_tile_brings_its_warps_and_depth_unless_they_are_pinned():
    m = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    small = default_plan(m, TARGETS["sm_90a"], None, parse_pins(["tile=64x64x64", "mma=wgmma"])).kernels[0]
    assert (small.warps, small.stages) == (8, 6)
    wide = default_plan(m, TARGETS["sm_90a"], None, parse_pins(["tile=128x256x64", "mma=wgmma"])).kernels[0]
    assert (wide.warps, wide.stages) == (12, 4)
    pinned = default_plan(m, TARGETS["sm_90a"], None,
                          parse_pins(["tile=128x256x64", "mma=wgmma", "stages=3"])).kernels[0]
    assert (pinned.warps, pinned.stages) == (12, 3)


def test_a_pin_that_no_kernel_of_the_plan_takes_is_an_error():
    """`--pin threads=64` on a GEMM was silently ignored: threads are a row or map kernel's choice."""
    from habu.errors import UsageError

    gemm = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    with pytest.raises(UsageError, match="--pin threads: no kernel of this plan has that choice"):
        default_plan(gemm, TARGETS["sm_90a"], None, parse_pins(["threads=64"]))
    softmax = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"]
    with pytest.raises(UsageError, match="a choice of contraction kernels"):
        default_plan(softmax, TARGETS["sm_90a"], None, parse_pins(["stages=3"]))
    ffn = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"]
    plan = default_plan(ffn, TARGETS["sm_90a"], None, parse_pins(["threads=256", "stages=3"]))  # both kinds here
    assert plan.kernels[-1].threads == 256 and plan.kernels[0].stages == 3
