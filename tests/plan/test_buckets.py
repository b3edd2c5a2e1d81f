"""Size buckets of runtime extents (habu/plan/buckets.py): the cut, its edges, the lookup, the ranges
a plan is proven for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from habu.plan.buckets import (
    LARGEST_TOP,
    SMALLEST_TOP,
    Bucket,
    BucketGrid,
    BucketMiss,
    bucketed_extents,
    cell_ranges,
    range_guards,
    restricted,
    size_buckets,
)
from habu.plan.plan import Plan
from habu.spec.ir import Extent
from habu.spec.parser import load_program, parse_text

ROOT = Path(__file__).resolve().parents[2]


def spans(extent: Extent) -> list[tuple[int, int]]:
    return [(b.lo, b.hi) for b in size_buckets(extent)]


def test_rmsnorm_width_gets_one_bucket_per_power_of_two():
    assert spans(Extent("D", None, 256, 65536, 256)) == [
        (256, 256), (512, 512), (768, 1024), (1280, 2048), (2304, 4096), (4352, 8192), (8448, 16384),
        (16640, 32768), (33024, 65536)]


def test_buckets_cover_every_admitted_size_once():
    for e in (Extent("D", None, 1, 5000, 1), Extent("D", None, 100, 70000, 3), Extent("D", None, 7, 7, 1),
              Extent("D", None, 300, 1000, 512)):
        admitted = [n for n in range(e.lo, e.hi + 1) if e.admits(n)]
        held = [n for n in admitted for b in size_buckets(e) if b.admits(n)]
        assert held == admitted, e
        for b in size_buckets(e):
            assert b.lo % e.multiple == 0 and b.hi % e.multiple == 0 and b.lo <= b.hi


def test_bucket_edges_clip_to_range_and_multiple():
    # a range starting and ending inside buckets; a multiple that is no power of two
    assert spans(Extent("D", None, 300, 1000, 1)) == [(300, 512), (513, 1000)]
    assert spans(Extent("D", None, 1, 600, 3)) == [(3, 255), (258, 510), (513, 600)]
    # a multiple larger than the first tops: the empty buckets are dropped
    assert spans(Extent("D", None, 512, 4096, 1024)) == [(1024, 1024), (2048, 2048), (3072, 4096)]
    # one size: one bucket
    assert spans(Extent("D", None, 7, 7, 1)) == [(7, 7)]
    assert size_buckets(Extent("D", 4096)) == ()


def test_sizes_past_the_largest_top_share_one_bucket():
    got = spans(Extent("D", None, 1, 2**31 - 1, 1))
    assert got[0] == (1, SMALLEST_TOP) and got[-2] == (LARGEST_TOP // 2 + 1, LARGEST_TOP)
    assert got[-1] == (LARGEST_TOP + 1, 2**31 - 1)
    assert len(got) == 11


def test_grid_index_at_bucket_edges():
    grid = BucketGrid((size_buckets(Extent("D", None, 256, 65536, 256)),))
    assert [grid.index({"D": n}) for n in (256, 512, 768, 1024, 1280, 4096, 4352, 65280, 65536)] == \
        [0, 1, 2, 2, 3, 4, 5, 8, 8]


def test_regression_a_size_outside_every_bucket_is_refused_with_a_clear_error():
    grid = BucketGrid(((Bucket("D", 256, 512, 256), Bucket("D", 1024, 2048, 256)),))
    for n in (768, 4096, 128, 300):
        with pytest.raises(BucketMiss, match=f"#D = {n} is in no bucket of the kernel set .*256..512, 1024..2048"):
            grid.index({"D": n})


def test_only_row_widths_are_bucketed():
    rms = load_program(ROOT / "examples" / "rmsnorm.habu")
    assert bucketed_extents(rms.model("RMSNORM-ROWS")) == ("D",)
    assert bucketed_extents(rms.model("RMSNORM-ROWS").with_sizes({"D": 4096})) == ()
    text = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
    assert bucketed_extents(parse_text(text, "g.habu").model("GGEMM")) == ()


def test_restricted_model_keeps_its_hash_and_refuses_ranges_outside_the_declaration():
    m = load_program(ROOT / "examples" / "rmsnorm.habu").model("RMSNORM-ROWS")
    r = restricted(m, (("D", 4352, 8192),))
    assert (r.extent("D").lo, r.extent("D").hi, r.extent("D").multiple) == (4352, 8192, 256)
    assert r.canonical_hash() == m.canonical_hash()
    with pytest.raises(ValueError, match="not within its declared range"):
        restricted(m, (("D", 128, 8192),))
    with pytest.raises(ValueError, match="not extents of"):
        restricted(m, (("Q", 1, 2),))
    with pytest.raises(ValueError, match="outside the plan's range"):
        restricted(m.with_sizes({"D": 256}), (("D", 4352, 8192),))


def test_plan_ranges_round_trip_and_leave_other_plans_keys_alone():
    plan = Plan("M", "h", "sm_90a", (("R", 8),), (), ())
    assert "ranges" not in plan.to_json()
    ranged = replace(plan, ranges=(("D", 4352, 8192),))
    assert Plan.from_json(ranged.to_json()) == ranged and ranged.key != plan.key
    assert range_guards(ranged.ranges) == ("4352 <= D", "D <= 8192")
    assert cell_ranges((Bucket("D", 1, 2),)) == (("D", 1, 2),)


def test_database_keys_without_ranges_keep_their_digests_and_bucket_keys_differ():
    import hashlib
    import json
    from dataclasses import asdict

    from habu.db import Key, Target, Versions, key_from_json

    key = Key("ab" * 16, "M", (("R", 64),), (("X", "bf16"),), Target("sm_90a", "NVIDIA H200", 132),
              Versions("0.1.0", "13.5", "580"))
    old = asdict(key)
    old.pop("model")
    old.pop("ranges")  # the key as stored before size buckets
    old.pop("direction")  # (a forward key's direction: left out too)
    assert key.digest() == hashlib.sha256(json.dumps(old, sort_keys=True).encode()).hexdigest()[:24]
    a, b = replace(key, ranges=(("D", 256, 256),)), replace(key, ranges=(("D", 512, 512),))
    assert len({key.digest(), a.digest(), b.digest()}) == 3
    assert len({key.same_problem(), a.same_problem(), b.same_problem()}) == 3
    assert key_from_json(json.loads(json.dumps(asdict(a)))) == a
    legacy = asdict(key)
    legacy.pop("ranges")
    assert key_from_json(legacy) == key
