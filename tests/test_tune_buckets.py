"""`habu search` / `habu.tune` and `habu.load` on a model with a bucketed runtime width: one search and
one plan-database entry per size bucket, each under a key that names its bucket; `load` proves each
bucket's stored plan again and dispatches by bucket."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console

from habu.db import PlanDB
from habu.plan.buckets import BucketGrid, cell_ranges
from habu.spec.parser import load_program
from tests.conftest import ROOT

RMSNORM = ROOT / "examples" / "rmsnorm.habu"


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    from habu.tuning import tune

    tmp = tmp_path_factory.mktemp("buckets")
    db = tmp / "db.sqlite"
    result = tune(RMSNORM, "RMSNORM-ROWS", shape={"R": 64}, budget=9, no_gpu=True, jobs=1, db=db, out=tmp / "out",
                  log=quiet(), target="sm_90a")
    return result, db, tmp / "out"


def test_search_stores_one_entry_per_bucket(searched):
    result, db, out = searched
    m = load_program(RMSNORM).model("RMSNORM-ROWS").with_sizes({"R": 64})
    cells = [cell_ranges(c) for c in BucketGrid.of(m).cells()]
    assert [t.ranges for t in result.tuned] == cells
    with PlanDB(db) as plans:
        entries = plans.entries()
        assert len(entries) == len(cells) == 9
        assert len({e.digest for e in entries}) == 9 and len({e.key.same_problem() for e in entries}) == 9
        for t in result.tuned:
            key = t.result.key
            assert key.ranges == t.ranges and dict(key.shape) == {"R": 64}  # the width is the bucket's
            entry = plans.get(key)
            assert entry is not None and entry.records[0].plan["ranges"] == [list(r) for r in t.ranges]
            assert entry.records[0].plan["shape"] == {"R": 64}
            # a lookup compares the whole key: another bucket's ranges find nothing under this digest
            other = replace(key, ranges=(("D", 256, 256),) if key.ranges != (("D", 256, 256),) else (("D", 512, 512),))
            assert plans.get(other) is None or plans.get(other).key.ranges == other.ranges
    assert (out / "D4352-8192" / "plan.json").exists() and (out / "D33024-65536" / "report.md").exists()


def test_load_dispatches_each_bucket_to_its_stored_plan(searched, monkeypatch):
    import habu
    import habu.gpu_info

    result, db, _ = searched
    monkeypatch.setattr(habu.gpu_info, "current_arch", lambda: "sm_90a")
    built = habu.load(RMSNORM, "RMSNORM-ROWS", db=db, R=64)
    ks = built.kernel_set
    for t in result.tuned:
        lo, hi = t.ranges[0][1:]
        for d in (lo, hi):
            plan = ks.select({"R": 64, "D": d})
            assert plan.kernels[0].name.split("_")[-2] == t.best.key[:8], (d, t.ranges)


def test_regression_a_plan_filed_under_another_bucket_is_refused(searched):
    from habu.api import checked_plan
    from habu.prove.trust import PlanRefused

    result, db, _ = searched
    first, last = result.tuned[0], result.tuned[-1]
    m = load_program(RMSNORM).model("RMSNORM-ROWS").with_sizes({"R": 64})
    with PlanDB(db) as plans:
        record = plans.get(last.result.key).records[0]
    with pytest.raises(PlanRefused, match="is filed under the size bucket"):
        checked_plan(m, first.result.key, record)


def test_search_without_the_width_is_refused_for_a_model_it_does_not_bucket(tmp_path):
    from habu.errors import UsageError
    from habu.tuning import tune

    src = tmp_path / "rt.habu"
    src.write_text((ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K"))
    with pytest.raises(UsageError, match=r"give the runtime extents with --shape \(K\)$"):
        tune(src, db=tmp_path / "db.sqlite", log=quiet(), no_gpu=True, shape={"M": 128, "N": 128})


def test_regression_a_bucket_candidate_that_holds_only_under_a_guard_is_refused(tmp_path):
    """The search stores plans without guards; a bucket's candidate whose rules hold only where a guard
    does (16-byte vectors of a row width not a multiple of 8) would be stored and then refused by
    `habu.load`'s re-proof. It is refused as a rules failure in the search instead."""
    from habu.plan.buckets import restricted
    from habu.search.space import default_plan
    from habu.search.tasks import Job, check_candidate
    from habu.spec.parser import parse_text
    from habu.target import target_named

    src = RMSNORM.read_text().replace("256..65536%256 EXTENT: #D", "1..65536 EXTENT: #D")
    path = tmp_path / "rms1.habu"
    path.write_text(src)
    m = parse_text(src, str(path)).model("RMSNORM-ROWS").with_sizes({"R": 64})
    ranges = (("D", 4097, 8192),)
    plan = replace(default_plan(restricted(m, ranges), target_named("sm_90a"), {"R": 64}), ranges=ranges)
    job = Job.of(str(path), m, {"R": 64}, "sm_90a")
    assert check_candidate(job, plan.to_json(), 1)["status"] == "verified"
    v8 = replace(plan, kernels=(replace(plan.kernels[0], vector=8),))
    result = check_candidate(job, v8.to_json(), 1)
    assert result["status"] == "rules"
    assert "holds only where And(D%8 == 0), not at every size of #D in 4097..8192" in result["reason"]
