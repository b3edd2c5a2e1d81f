"""The orchestration behind `habu search` and `habu.tune` (habu/tuning.py): the options it refuses, one
proof of the winner, one report written whole, the default target shared with compile."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

import habu
from habu.db import PlanDB, Record
from habu.errors import HabuError, UsageError
from tests.conftest import ROOT

GGEMM = ROOT / "examples" / "ggemm.habu"
SMALL = {"M": 128, "N": 128, "K": 64}


def quiet() -> Console:
    return Console(file=io.StringIO(), width=200)


@pytest.mark.parametrize("options, message", [
    ({"budget": "0"}, "positive budget"), ({"budget": "0s"}, "positive budget"), ({"budget": "soon"}, "--budget"),
    ({"jobs": 0}, "--jobs takes a positive number, got 0"), ({"top_k": 0}, "--top-k takes a positive number"),
])
def test_tune_refuses_bad_options_before_any_work(tmp_path, options, message):
    with pytest.raises(UsageError, match=message):
        habu.tune(GGEMM, db=tmp_path / "db.sqlite", out=tmp_path / "out", log=quiet(), no_gpu=True,
                  **options, **SMALL)
    assert not (tmp_path / "db.sqlite").exists() and not (tmp_path / "out").exists()


def test_tune_refuses_an_out_directory_inside_a_file(tmp_path):
    (tmp_path / "FILE").write_text("")
    with pytest.raises(UsageError, match="is a file"):
        habu.tune(GGEMM, db=tmp_path / "db.sqlite", out=tmp_path / "FILE" / "sub", log=quiet(), no_gpu=True, **SMALL)


def test_tune_asks_for_the_runtime_extents(tmp_path):
    src = tmp_path / "rt.habu"
    src.write_text(GGEMM.read_text().replace("4096 EXTENT: #M", "1..65536 EXTENT: #M"))
    with pytest.raises(UsageError, match="give the runtime extents"):
        habu.tune(src, db=tmp_path / "db.sqlite", log=quiet(), no_gpu=True, N=128, K=64)


def test_habu_tune_stores_the_winner_proves_it_once_and_writes_one_whole_report(tmp_path, monkeypatch):
    import habu.gpu_info
    import habu.prove

    real = habu.prove.prove
    proven: list[str] = []

    def counting(model, plan, *args, **kwargs):
        proven.append(plan.key)
        return real(model, plan, *args, **kwargs)

    monkeypatch.setattr(habu.prove, "prove", counting)
    # the one default target (compile's too): this machine's GPU, here a stand-in for an A100
    monkeypatch.setattr(habu.gpu_info, "current_arch", lambda: "sm_80")
    out, db = tmp_path / "out", tmp_path / "db.sqlite"
    seen = []
    from habu.tuning import tune

    result = tune(GGEMM, shape=SMALL, budget=3, no_gpu=True, jobs=1, db=db, out=out, log=quiet(),
                  on_tuned=seen.append)
    (tuned,) = result.tuned
    assert seen == [tuned] and not result.interrupted
    assert tuned.target.name == "sm_80" and result.best is not None and result.best.target == "sm_80"
    assert proven == [result.best.key]  # the winner, once; the search's candidates are checked by the tasks
    with PlanDB(db) as plans:
        entry = plans.get(tuned.result.key)
    assert entry is not None and entry.key.target.arch == "sm_80"
    assert entry.records[0].plan == result.best.to_json()
    assert json.loads((out / "plan.json").read_text()) == result.best.to_json()
    certificate = json.loads((out / "certificate.json").read_text())
    assert certificate == [tuned.proof.certificate.to_json()] and certificate[0]["plan_key"] == result.best.key
    assert certificate[0]["trials"] == 3  # the full-shape proof, not the search's one-trial witness check
    report = (out / "report.md").read_text()
    assert report.count("# Compilation report: GGEMM") == 1 and "## Measured" not in report  # nothing timed
    assert tuned.not_made == ["no roofline.png: nothing was timed (no GPU), so there is nothing to plot"]
    assert out / "report.md" in tuned.files and not (out / "roofline.png").exists()
    # habu.tuning and habu.search are imported by now: no module is named like the function
    assert callable(habu.tune) and habu.tune.__module__ == "habu"


def test_a_search_that_verifies_nothing_raises_after_reporting_it(tmp_path, monkeypatch, every_field_check_fails):
    from habu.search import tasks
    from habu.tuning import tune

    seen = []
    log = quiet()
    try:
        with pytest.raises(HabuError, match="the search verified no plan for GGEMM on sm_90a"):
            tune(GGEMM, shape=SMALL, target="sm_90a", budget=1, no_gpu=True, jobs=1, db=tmp_path / "db.sqlite",
                 out=tmp_path / "out", log=log, on_tuned=seen.append)
    finally:
        tasks.FIELD_CHECKS.clear()
    assert len(seen) == 1 and seen[0].best is None and seen[0].proof is None
    assert "nothing stored in" in log.file.getvalue() and not (tmp_path / "out").exists()


def test_the_report_has_its_measured_section_once_written_with_the_rest(tmp_path):
    from habu.compile import Measured, compile_model, write_outputs
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    program = load_program(GGEMM)
    compiled = compile_model(program, "GGEMM", SMALL, TARGETS["sm_90a"], {}, trials=1)
    measured = Measured(20.0, 19.5, 20.5, 5.0, "torch A[IX] @ B.T", 30.0)
    write_outputs(tmp_path, compiled.model, compiled, None, measured)
    report = (tmp_path / "report.md").read_text()
    assert report.count("# Compilation report") == 1 and report.count("## Measured") == 1
    assert "median 20.0 µs (p20 19.5, p80 20.5); roofline 5.0 µs: 25% of it" in report
    assert "baseline torch A[IX] @ B.T: 30.0 µs in the same run; the plan is 1.50× its speed" in report


def test_regression_the_measured_section_reads_the_winners_record_not_the_entrys_first():
    """`habu search` reported the time of the entry's first record, which can be a plan an earlier search
    stored (faster), under the report of this search's winner."""
    from habu.search.budget import SearchResult, Stats
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from habu.tuning import winner_record

    model = next(iter(load_program(GGEMM).models.values())).with_sizes(SMALL)
    plan = default_plan(model, TARGETS["sm_90a"], SMALL)
    earlier = Record(0, {**plan.to_json(), "note": "an earlier search's plan"}, "measured", median_us=5.0)
    ours = Record(1, plan.to_json(), "measured", median_us=9.0)
    result = SearchResult(plan, [earlier, ours], Stats(), None, True, [])  # type: ignore[arg-type]
    assert winner_record(result) is ours
    assert winner_record(SearchResult(None, [earlier], Stats(), None, True, [])) is None  # type: ignore[arg-type]


def test_regression_a_search_of_a_derived_backward_stores_it_keyed_backward_where_load_finds_it(tmp_path):
    # the search's workers and habu.load re-read the model from the file by name, where a derived backward
    # was not found; NAME-GRAD (habu.spec.grad_program.backward_name) is derived again from its name
    from habu.api import lookup_key
    from habu.compile import bind_shape
    from habu.spec.grad_program import with_backward
    from habu.spec.parser import load_program
    from habu.target import target_named
    from habu.tuning import tune

    rms, db = ROOT / "examples" / "rmsnorm.habu", tmp_path / "db.sqlite"
    result = tune(rms, "RMSNORM-ROWS-GRAD", shape={"R": 64, "D": 256}, target="sm_90a", budget=2, no_gpu=True,
                  jobs=1, db=db, out=tmp_path / "out", log=quiet())
    (tuned,) = result.tuned
    assert tuned.result.key.direction == "backward" and tuned.result.key.model == "RMSNORM-ROWS-GRAD"
    model = with_backward(load_program(rms), "RMSNORM-ROWS-GRAD").model("RMSNORM-ROWS-GRAD")
    key = lookup_key(bind_shape(model, {"R": 64, "D": 256}), target_named("sm_90a"))
    with PlanDB(db) as plans:
        entry = plans.get(key)
    assert entry is not None and entry.records[0].plan == result.best.to_json()


def test_a_backward_search_tries_each_save_policy_and_names_the_fastest(tmp_path):
    # save or recompute is a dimension of the backward plan space: each policy's backward is searched and stored
    # under its own name (RMSNorm's auto and save read the same rstd: one backward, searched once), and the
    # fastest proven one (here by the cost model) wins; recomputing the rstd takes no kernel of its own since
    # session 32 (a row kernel computes the statistic, then dX from it: `nodes ('%s1', 'dX')`)
    from habu.tuning import tune_backward

    db = tmp_path / "db.sqlite"
    choice = tune_backward(ROOT / "examples" / "rmsnorm.habu", "RMSNORM-ROWS", shape={"R": 64, "D": 256},
                           target="sm_90a", budget=2, no_gpu=True, jobs=1, db=db, out=tmp_path / "out", log=quiet())
    runs = {r.mode: r for r in choice.runs}
    assert runs["save"].same_as == "auto" and runs["save"].result is None
    auto, recompute = runs["auto"], runs["recompute"]
    assert auto.name == "RMSNORM-ROWS-GRAD" and recompute.name == "RMSNORM-ROWS-GRAD-RECOMPUTE"
    assert auto.saved_bytes == 4 * 64 and recompute.saved_bytes == 0  # the f32 rstd of each row, or nothing
    assert not choice.measured and auto.total_us is not None and recompute.total_us is not None
    assert choice.best is min((auto, recompute), key=lambda r: r.total_us)
    assert [k.nodes for k in recompute.result.best.kernels] == [("%s1", "dX")]
    assert len(auto.result.best.kernels) == 1
    assert choice.best.mode in choice.describe() and (tmp_path / "out" / "recompute" / "plan.json").exists()
    with PlanDB(db) as plans:
        models = {e.key.model for e in plans.entries()}
    assert models == {"RMSNORM-ROWS-GRAD", "RMSNORM-ROWS-GRAD-RECOMPUTE"}
