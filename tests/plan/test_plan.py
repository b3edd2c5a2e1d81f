"""Plans: frozen, hashable, JSON round trip, clear errors for bad plan files."""

from __future__ import annotations

import json
import re

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
    (lambda d: d["kernels"][0].update(tile_m="big"), "kernel 0: tile_m must be a whole number ≥ 1, got 'big'"),
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


@pytest.mark.slow  # 11 s: enumerates the whole space
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
    # 112 and 128 tiles, their rings as deep as shared memory holds (issue 20 §2's skinny defaults)
    assert (first.tile_m, first.tile_n, first.warps, first.stages) == (128, 128, 12, 6)
    assert (second.tile_m, second.tile_n, second.warps, second.stages) == (64, 64, 8, 13)
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
    with pytest.raises(UsageError, match=r"a choice of (attention or )?contraction (or grouped )?kernels"):
        default_plan(softmax, TARGETS["sm_90a"], None, parse_pins(["stages=3"]))
    ffn = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"]
    plan = default_plan(ffn, TARGETS["sm_90a"], None, parse_pins(["threads=256", "stages=3"]))  # both kinds here
    assert plan.kernels[-1].threads == 256 and plan.kernels[0].stages == 3


# ----------------------------------------------------------------------------- the field table


def _json(path: str, model: str, sizes: dict | None = None) -> dict:
    m = load_program(ROOT / "examples" / path).models[model]
    return default_plan(m, TARGETS["sm_90a"], sizes).to_json()


GGEMM_BAD = [
    ("mma", "tensorcore", "kernel 0: mma must be one of fma, mma.sync, wgmma, got 'tensorcore'"),
    ("a_move", "teleport", "kernel 0: a_move must be one of ldg, cp.async, tma, tma-gather4, staged"),
    ("b_move", 3, "kernel 0: b_move must be one of ldg"),
    ("raster", "diagonal", "kernel 0: raster must be one of row, column, got 'diagonal'"),
    ("store", "mail", "kernel 0: store must be one of direct, tma, got 'mail'"),
    ("accumulator", "f16", "kernel 0: accumulator must be one of f32, got 'f16'"),
    ("stages", 0, "kernel 0: stages must be a whole number ≥ 1, got 0"),
    ("tile_k", 0, "kernel 0: tile_k must be a whole number ≥ 1, got 0"),
    ("tile_m", -64, "kernel 0: tile_m must be a whole number ≥ 1, got -64"),
    ("warps", 0, "kernel 0: warps must be a whole number ≥ 1, got 0"),
    ("split_k", 0, "kernel 0: split_k must be a whole number ≥ 1, got 0"),
    ("group_m", 0, "kernel 0: group_m must be a whole number ≥ 1, got 0"),
    ("cluster_m", 0, "kernel 0: cluster_m must be one of 1, 2, got 0"),
    ("index_width", 48, "kernel 0: index_width must be one of 32, 64, got 48"),
    ("swizzle", 100, "kernel 0: swizzle must be one of 0, 32, 64, 128, got 100"),
    ("persistent", 1, "kernel 0: persistent must be true or false, got 1"),
    ("a_vector", True, "kernel 0: a_vector must be a whole number ≥ 1, got True"),
]


@pytest.mark.parametrize("name, value, message", GGEMM_BAD, ids=[f"{n}={v}" for n, v, _ in GGEMM_BAD])
def test_a_plan_file_with_a_field_outside_its_values_is_refused_naming_kernel_field_and_values(name, value, message):
    data = _json("ggemm.habu", "GGEMM")
    data["kernels"][0][name] = value
    with pytest.raises(HabuError) as err:
        Plan.from_json(data, "p.json")
    assert "p.json: not a valid Habu plan: " + message in err.value.message


@pytest.mark.parametrize("name, value, message", [
    ("threads", 48, "kernel 0: threads must be a whole number in 32..1024, a multiple of 32, got 48"),
    ("threads", 2048, "kernel 0: threads must be a whole number in 32..1024"),
    ("rows_per_block", 0, "kernel 0: rows_per_block must be a whole number ≥ 1, got 0"),
    ("vector", 0, "kernel 0: vector must be a whole number ≥ 1, got 0"),
    ("cluster", 3, "kernel 0: cluster must be one of 1, 2, 4, 8, got 3"),
])
def test_a_row_kernel_field_outside_its_values_is_refused(name, value, message):
    data = _json("softmax.habu", "SOFTMAX-ROWS")
    data["kernels"][0][name] = value
    with pytest.raises(HabuError, match=re.escape(message)):
        Plan.from_json(data, "p.json")


def test_plan_json_keeps_its_strings_and_reads_back_enums():
    """The closed vocabularies are str enums: JSON holds the same strings as before, a plan read
    back holds the enum members, and both compare and hash as the strings."""
    from habu.plan.fields import Mma, Move

    data = _json("ggemm.habu", "GGEMM")
    assert json.loads(json.dumps(data)) == data
    k = Plan.from_json(data).kernels[0]
    assert type(k.mma) is Mma and k.mma == data["kernels"][0]["mma"] and type(k.a_move) is Move
    assert type(json.dumps(data)) is str and '"mma": "wgmma"' in json.dumps(data)


def test_a_kernel_built_with_an_unknown_vocabulary_word_is_an_error():
    from habu.plan.fields import FieldError
    from habu.plan.plan import with_fields

    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    k = default_plan(m, TARGETS["sm_90a"]).kernels[0]
    assert with_fields(k, mma="mma.sync").mma == "mma.sync"
    with pytest.raises(FieldError, match=re.escape("mma must be one of fma, mma.sync, wgmma, got 'tensorcore'")):
        with_fields(k, mma="tensorcore")


@pytest.mark.parametrize("pin, message", [
    ("stages=0", "--pin stages=0: expected a whole number ≥ 1"),
    ("tile=128x128x0", "--pin tile=128x128x0: tile_k = 0: expected a whole number ≥ 1"),
    ("warps=0", "--pin warps=0: expected a whole number ≥ 1"),
    ("split_k=0", "--pin split_k=0: expected a whole number ≥ 1"),
    ("group_m=0", "--pin group_m=0: expected a whole number ≥ 1"),
    ("index=48", "--pin index=48: expected one of 32, 64"),
    ("raster=diagonal", "--pin raster=diagonal: expected one of row, column"),
    ("store=mail", "--pin store=mail: expected one of direct, tma"),
    ("B=teleport", "--pin B=teleport: expected one of ldg, cp.async, tma, tma-gather4, staged"),
    ("persistent=maybe", "--pin persistent=maybe: expected true or false"),
])
def test_pins_are_parsed_and_checked_by_the_field_table(pin, message):
    from habu.errors import UsageError

    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    with pytest.raises(UsageError, match=re.escape(message)):
        default_plan(m, TARGETS["sm_90a"], None, parse_pins([pin]))


def test_regression_row_threads_48_pin_is_refused():
    """`--pin threads=48` on a 64x1000 softmax was certified and wrong on the GPU: the block
    reduction combines one partial per whole warp and dropped the partial warp's."""
    from habu.errors import UsageError

    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"]
    with pytest.raises(UsageError, match=re.escape("--pin threads=48: expected a whole number in 32..1024, a "
                                                   "multiple of 32")):
        default_plan(m, TARGETS["sm_90a"], {"R": 64, "C": 1000}, parse_pins(["threads=48"]))


def test_the_pin_keys_come_from_the_field_table():
    from habu.plan.fields import kernel_fields
    from habu.plan.plan import KERNEL_KINDS
    from habu.search.space import PIN_FIELDS, PIN_KEYS

    for cls in KERNEL_KINDS.values():
        for kf in kernel_fields(cls):
            for key in kf.spec.pins if kf.spec else ():
                assert kf.name in PIN_FIELDS[key] and key in PIN_KEYS
    assert PIN_FIELDS["split_k"] == PIN_FIELDS["splitk"] == ("split_k",)
    assert set(PIN_FIELDS["vector"]) == {"a_vector", "b_vector", "vector"}


def test_every_schedule_field_is_in_the_table():
    """Every kernel field but `nodes` has a spec: a doc, what reads it, its allowed values; a field
    left out of JSON at its default has one, and the table's text matches the JSON check's."""
    from dataclasses import MISSING

    from habu.plan.fields import Reader, kernel_fields
    from habu.plan.plan import KERNEL_KINDS

    for cls in KERNEL_KINDS.values():
        for kf in kernel_fields(cls):
            if kf.name == "nodes":
                assert kf.spec is None
                continue
            assert kf.spec is not None and kf.spec.doc and isinstance(kf.spec.reader, Reader), kf.name
            assert kf.describe(), kf.name
            assert not kf.spec.json_optional or kf.default is not MISSING, kf.name
            if kf.default is not MISSING:
                assert kf.problem(kf.default) is None, kf.name
