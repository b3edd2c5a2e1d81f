"""The search without a GPU (and with a stand-in timer): budgets, anytime saving, faults, kills."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import ClassVar

import pytest

from habu.db import PlanDB
from habu.errors import UsageError
from habu.search.loop import Budget, Search
from habu.search.pool import InlineExecutor
from habu.spec.parser import load_program
from habu.target import TARGETS
from habu.timing.worker import Measurement
from tests.conftest import EXAMPLES, ROOT, child_default_sigint


def model_of(path, sizes=None):
    program = load_program(path)
    m = next(iter(program.models.values()))
    runtime = {e.name: 4096 for e in m.extents if not e.is_static}
    sizes = (sizes or {}) | runtime
    return m.with_sizes(sizes), sizes


@pytest.mark.parametrize("text, seconds, trials", [("90s", 90, None), ("10m", 600, None), ("1h", 3600, None),
                                                   ("1h30m", 5400, None), ("25", None, 25)])
def test_budget_parsing(text, seconds, trials):
    b = Budget.parse(text)
    assert b.seconds == seconds and b.trials == trials


def test_bad_budget():
    with pytest.raises(UsageError, match="--budget"):
        Budget.parse("soon")


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_a_one_trial_search_of_every_example_verifies_a_candidate_and_stores_it(path, tmp_path):
    """(It used to assert the first verified candidate came within 10 s: a timed test, which failed on a
    loaded 2-core machine at 20 s. How fast is measured in docs/PERF.md, not here. Three trials of every
    example took about eight minutes of CI; the searches of several trials are tested on GGEMM below.)"""
    model, sizes = model_of(path)
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=1)).run()
        assert result.stats.first_verified_s is not None and result.stats.verified >= 1
        assert not result.measured and result.records[0].status == "unmeasured"
        assert db.get(result.key).records[0].plan == result.best.to_json()


class FakeTimer:
    """Stands in for the GPU worker: times plans by a formula, fails or hangs some."""

    info: ClassVar[dict] = {"gpu": "Fake GPU", "sm_count": 132, "arch": "sm_90a", "driver": "13.0"}

    def __init__(self):
        self.calls = 0

    def measure(self, plan):
        self.calls += 1
        k = plan["kernels"][0]
        if self.calls % 4 == 2:
            return Measurement(False, "timed out after 120 s (a hung kernel?); worker restarted")
        if self.calls % 4 == 3:
            return Measurement(False, "the timing worker died (a kernel fault?); worker restarted")
        t = 100.0 + k["stages"] + (k["tile_n"] != 256) * 10
        return Measurement(True, median_us=t, p20_us=t - 1, p80_us=t + 1, samples_us=[t], golden={"O": {"ok": True}})

    def close(self):
        pass


def test_faults_are_recorded_and_the_search_goes_on(tmp_path):
    path = ROOT / "examples" / "ggemm.habu"
    model, sizes = model_of(path, {"M": 512, "N": 512, "K": 512})
    timer = FakeTimer()
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=12), timer=timer).run()
        entry = db.get(result.key)
        assert result.measured and entry.records[0].status == "measured"
        assert entry.key.target.gpu == "Fake GPU"
        reasons = " ".join(f["reason"] for f in entry.failures)
        assert "timed out" in reasons and "worker died" in reasons
        times = [r.median_us for r in entry.records if r.median_us]
        assert times == sorted(times)


def test_every_timed_candidate_is_written_with_its_prediction_and_time(tmp_path):
    """`habu search -o DIR` writes candidates.csv: one row per candidate the GPU timed (failures are
    recorded in the database instead), with the cost model's prediction beside the measurement."""
    import csv

    from habu.search.report import CANDIDATE_COLUMNS, write_candidates

    path = ROOT / "examples" / "ggemm.habu"
    model, sizes = model_of(path, {"M": 512, "N": 512, "K": 512})
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=12), timer=FakeTimer()).run()
    rows = list(csv.DictReader(write_candidates(result, tmp_path / "candidates.csv").open()))
    assert rows and tuple(rows[0]) == CANDIDATE_COLUMNS and len(rows) == result.stats.timed
    assert {r["plan_key"] for r in rows} >= {result.best.key}
    for r in rows:  # the fake timer's formula, and the model's own prediction
        assert float(r["median_us"]) in {100.0 + s + n for s in range(1, 9) for n in (0, 10)}
        assert float(r["predicted_us"]) > 0 and r["plan"].split()[0] in ("wgmma", "mma.sync", "fma")


def test_ctrl_c_keeps_the_best_plan(tmp_path):
    path = ROOT / "examples" / "ggemm.habu"
    model, sizes = model_of(path, {"M": 512, "N": 512, "K": 512})
    seen = []

    def interrupt(stats):
        seen.append(stats.verified)
        if stats.verified >= 2:
            raise KeyboardInterrupt

    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(seconds=300),
                        progress=interrupt).run()
        assert result.stats.verified >= 2 and result.stats.elapsed < 200
        assert db.get(result.key).records


class InterruptedExecutor(InlineExecutor):
    """Proves the first `proofs` batches, then Ctrl-C arrives while the next is being proven."""

    def __init__(self, proofs: int):
        super().__init__()
        self.proofs = proofs

    def submit(self, job, items):
        if self.proofs == 0:
            raise KeyboardInterrupt
        self.proofs -= 1
        return super().submit(job, items)


class SwallowedInterruptExecutor(InlineExecutor):
    """Ctrl-C arrives while the first batch is proven, inside a finalizer (z3's AstRef.__del__): CPython prints
    such an exception as ignored and drops it, so the batch returns its results as if nothing happened; only
    the latch (habu/search/interrupt.py) saw it."""

    def submit(self, job, items):
        from habu.search.interrupt import LATCH

        pending = super().submit(job, items)
        LATCH.seen = True
        return pending


def ggemm_search(db, budget, executor=None):
    path = ROOT / "examples" / "ggemm.habu"
    model, sizes = model_of(path, {"M": 512, "N": 512, "K": 256})
    return Search(str(path), model, TARGETS["sm_90a"], sizes, db, budget, executor=executor)


def test_regression_a_search_interrupted_before_the_first_proof_stores_no_plan(tmp_path):
    """Ctrl-C before the default plan was proven stored it, with no certificate, as the winner."""
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = ggemm_search(db, Budget(seconds=60), InterruptedExecutor(0)).run()
        assert result.interrupted and result.best is None and result.records == []
        assert db.entries() == []


def test_regression_habu_search_ctrl_c_before_the_first_proof_exits_130_and_stores_nothing(tmp_path):
    dbpath = tmp_path / "db.sqlite"
    proc = subprocess.Popen([sys.executable, "-m", "habu", "search", "examples/ggemm.habu", "--budget", "60s",
                             "--db", str(dbpath), "-o", str(tmp_path / "out")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=child_default_sigint)
    assert proc.stderr is not None
    for line in proc.stderr:  # the search starts once the timer is known (here: no GPU)
        if "nothing will be timed" in line or "timing on" in line:
            break
    time.sleep(0.3)  # proving GGEMM's default plan at 4096³ takes seconds
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    # 130, or killed by SIGINT (CPython re-raises an interrupt it saw unhandled in nested code that
    # way): either is status 130 in a shell
    assert proc.returncode in (130, -signal.SIGINT), err
    assert "interrupted" in err and "Traceback" not in err and "0 verified" not in out + err
    if dbpath.exists():
        with PlanDB(dbpath) as db:
            assert all(not e.records for e in db.entries())


def test_a_second_ctrl_c_skips_the_winners_full_shape_proof_and_keeps_the_stored_plan(tmp_path, monkeypatch):
    """After a Ctrl-C, `habu search` proved the winner again at the full shape (13-18 s at GGEMM 4096³ on
    the H200's host) before it answered, saying nothing. It now says so, and a Ctrl-C during that proof
    skips the files (the plan the search proved stays stored); without the first Ctrl-C, one there ends
    the run as before. (A subprocess test raced the proof: a cached one ends before a signal lands.)"""
    import io

    from rich.console import Console

    import habu.tuning as tuning
    from habu.search.pool import InlineExecutor

    with PlanDB(tmp_path / "db.sqlite") as db:
        result = ggemm_search(db, Budget(seconds=60), InterruptedExecutor(1)).run()
    assert result.interrupted and result.best is not None
    tuned = tuning.Tuned(TARGETS["sm_90a"], result, tmp_path / "db.sqlite", InlineExecutor.__name__)
    model, sizes = model_of(ROOT / "examples" / "ggemm.habu", {"M": 512, "N": 512, "K": 256})

    def ctrl_c_in_the_proof(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tuning, "_write_winner", ctrl_c_in_the_proof)
    log = Console(file=io.StringIO(), width=400)
    tuning._write_winner_unless_skipped(tuned, model, sizes, tmp_path / "out", log)
    said = log.file.getvalue()
    assert "interrupted: proving the winner at the full shape before writing its files (Ctrl-C again" in said
    assert f"files not written: plan {result.best.key} is stored in {tmp_path / 'db.sqlite'}" in said
    assert tuned.files == [] and not (tmp_path / "out").exists()
    with PlanDB(tmp_path / "db.sqlite") as db:
        assert db.get(result.key).records[0].plan == result.best.to_json()
    # a search that was not interrupted: a Ctrl-C while its winner is written ends the run
    result.interrupted = False
    with pytest.raises(KeyboardInterrupt):
        tuning._write_winner_unless_skipped(tuned, model, sizes, tmp_path / "out", log)


def test_regression_a_ctrl_c_a_finalizer_swallowed_still_ends_the_search_and_stores_nothing(tmp_path):
    """`habu search` ran its whole 60 s budget after a Ctrl-C and exited 0 (1 run in 13 under load): the
    KeyboardInterrupt was raised inside z3's `AstRef.__del__` and dropped. The latch raises it at the search's
    next step, before the batch proven meanwhile is kept."""
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = ggemm_search(db, Budget(seconds=60), SwallowedInterruptExecutor()).run()
        assert result.interrupted and result.best is None and result.records == []
        assert db.entries() == []


def test_the_latch_raises_at_once_outside_a_finalizer_and_defers_inside_one():
    """SIGINT inside the latched block: KeyboardInterrupt at once where the main thread runs ordinary code; in a
    `__del__` only the latch is set (no "Exception ignored" printed), and `raise_if_interrupted` raises it."""
    import os
    import sys

    from habu.search.interrupt import latched_interrupts, raise_if_interrupted

    unraisable = []
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)  # (an xdist worker has another)

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100000):  # the handler runs here, in the finalizer's frame
                pass

    try:
        with latched_interrupts() as latch:
            with pytest.raises(KeyboardInterrupt):
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100000):
                    pass
            latch.seen = False
            obj = Finalized()
            del obj
            assert latch.seen and not unraisable
            with pytest.raises(KeyboardInterrupt):
                raise_if_interrupted()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous_sigint)


def test_regression_a_ctrl_c_inside_a_ctypes_callback_prints_no_traceback_and_is_raised_at_the_next_step():
    """CI, stop 44: SIGINT landed in llvmlite's object-cache callback (numba compiling for the field check);
    ctypes printed "Exception ignored on calling ctypes callback function ... Traceback" and dropped the
    KeyboardInterrupt. Inside the latched block nothing reaches the unraisable hook (which printed it) and the
    latch raises it at the next step."""
    import ctypes
    import os
    import sys

    from habu.search.interrupt import latched_interrupts, raise_if_interrupted

    unraisable = []
    previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)  # (an xdist worker has another)

    @ctypes.CFUNCTYPE(ctypes.c_int)
    def callback():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100000):  # the handler runs here, inside the callback
            pass
        return 1

    try:
        with latched_interrupts() as latch:
            callback()  # the KeyboardInterrupt ends the callback; ctypes returns 0 and drops it
            assert latch.seen and not unraisable
            with pytest.raises(KeyboardInterrupt):
                raise_if_interrupted()
        assert sys.unraisablehook == unraisable.append
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, previous_sigint)


def test_a_search_interrupted_after_a_proof_stores_the_verified_plan_with_its_certificate(tmp_path):
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = ggemm_search(db, Budget(seconds=60), InterruptedExecutor(1)).run()
        assert result.interrupted and result.best is not None and result.stats.verified == 1
        (record,) = db.get(result.key).records
        assert record.plan == result.best.to_json() and record.certificate["plan_key"] == result.best.key


def test_a_search_stores_only_plans_it_verified_each_with_its_own_certificate(tmp_path):
    from habu.plan.plan import Plan

    with PlanDB(tmp_path / "db.sqlite") as db:
        result = ggemm_search(db, Budget(trials=6)).run()
        records = db.get(result.key).records
        assert len(records) > 1
        for r in records:
            plan = Plan.from_json(r.plan)
            assert r.certificate["passed"] and r.certificate["plan_key"] == plan.key
            assert r.certificate["model_hash"] == result.key.model_hash


def test_a_search_that_verifies_no_plan_stores_none(tmp_path, monkeypatch, every_field_check_fails):
    from habu.search import tasks

    with PlanDB(tmp_path / "db.sqlite") as db:
        result = ggemm_search(db, Budget(trials=3)).run()
        assert result.best is None and result.records == [] and not result.interrupted
        assert all(not e.records for e in db.entries())  # the failures are kept, no plan
    tasks.FIELD_CHECKS.clear()


def test_a_search_killed_mid_run_leaves_its_best_plan(tmp_path):
    dbpath = tmp_path / "db.sqlite"
    env = dict(os.environ, HABU_DB=str(dbpath))
    proc = subprocess.Popen([sys.executable, "-m", "habu", "search", "examples/ggemm.habu", "--budget", "120s",
                             "--no-gpu", "--shape", "M=512,N=512,K=512", "-o", str(tmp_path / "out")],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    while time.time() < deadline:  # wait until the first plan is stored
        time.sleep(0.5)
        if dbpath.exists():
            try:
                with PlanDB(dbpath) as db:
                    if any(e.records for e in db.entries()):
                        break
            except Exception:
                pass
    time.sleep(3)  # mid-search
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    with PlanDB(dbpath) as db:
        (entry,) = db.entries()
        assert entry.records and entry.records[0].certificate
    import sqlite3

    assert sqlite3.connect(dbpath).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


class KernelCountTimer:
    """Times a plan by its number of launches: `per_kernel` µs each (negative: more kernels win)."""

    info: ClassVar[dict] = {"gpu": "Fake GPU", "sm_count": 132, "arch": "sm_90a", "driver": "13.0"}

    def __init__(self, per_kernel: float):
        self.per_kernel = per_kernel

    def measure(self, plan):
        t = 100.0 + self.per_kernel * len(plan["kernels"])
        return Measurement(True, median_us=t, p20_us=t, p80_us=t, samples_us=[t], golden={"y": {"ok": True}})

    def close(self):
        pass


@pytest.mark.parametrize("per_kernel, kernels", [(10.0, 1), (-10.0, 3)])
def test_the_search_picks_the_fastest_fusion_partition(tmp_path, per_kernel, kernels):
    path = ROOT / "examples" / "fused.habu"
    model, sizes = model_of(path, {"N": 4096})
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=30),
                        timer=KernelCountTimer(per_kernel)).run()
        assert result.stats.partitions == 3
        assert len(result.best.kernels) == kernels
        assert db.get(result.key).records[0].plan == result.best.to_json()


def test_without_a_gpu_the_cost_model_keeps_the_fused_partition(tmp_path):
    path = ROOT / "examples" / "fused.habu"
    model, sizes = model_of(path, {"N": 4096})
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=5)).run()
        assert len(result.best.kernels) == 1  # every cut adds a round trip through global memory


class BaselineTimer(KernelCountTimer):
    def baseline(self):
        return "torch A[IX] @ B.T", Measurement(True, median_us=150.0, p20_us=149.0, p80_us=151.0)


def test_the_baseline_is_timed_in_the_same_run_and_kept_with_the_plans(tmp_path):
    path = ROOT / "examples" / "fused.habu"
    model, sizes = model_of(path, {"N": 4096})
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=3),
                        timer=BaselineTimer(10.0)).run()
        assert result.stats.baseline_us == 150.0
        record = db.get(result.key).records[0]
        assert record.provenance["baseline"] == "torch A[IX] @ B.T" and record.provenance["baseline_us"] == 150.0
        from habu.search.report import progress_text

        assert "1.36× baseline" in progress_text(result.stats, Budget(trials=3))  # 150 / 110


def test_plans_that_differ_only_in_raster_order_read_differently_in_the_table():
    from habu.search.report import plan_summary
    from habu.search.space import default_plan

    model, sizes = model_of(ROOT / "examples" / "ggemm.habu", {"M": 512, "N": 512, "K": 512})
    plan = default_plan(model, TARGETS["sm_90a"], sizes).to_json()
    column = {**plan, "kernels": [{**plan["kernels"][0], "raster": "column"}]}
    assert plan_summary(plan) != plan_summary(column) and "column-raster" in plan_summary(column)


def test_habu_search_that_verifies_no_plan_says_so_exits_1_and_stores_none(tmp_path, monkeypatch, capsys, every_field_check_fails):
    from habu.cli import main
    from habu.search import tasks

    db = tmp_path / "db.sqlite"
    monkeypatch.setattr(sys, "argv", ["habu", "search", str(ROOT / "examples" / "ggemm.habu"), "--budget", "2",
                                      "--no-gpu", "--jobs", "1", "--shape", "M=512,N=512,K=256", "--db", str(db),
                                      "-o", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as exit_:
        main()
    tasks.FIELD_CHECKS.clear()
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "error: the search verified no plan for GGEMM" in err
    assert "nothing stored" in err.replace("\n", " ")
    with PlanDB(db) as plans:
        assert all(not e.records for e in plans.entries())
    assert not (tmp_path / "out").exists()


class CountingTimer(KernelCountTimer):
    def __init__(self, per_kernel: float):
        super().__init__(per_kernel)
        self.calls = 0

    def measure(self, plan):
        self.calls += 1
        return super().measure(plan)


def test_storing_times_nothing_finalists_without_a_time_are_timed_first(tmp_path):
    """`Search._store` timed runners-up while it wrote the database; now it only writes, and the
    finalists with no measurement (a timing that failed or was dropped) are timed before it."""
    path = ROOT / "examples" / "fused.habu"
    model, sizes = model_of(path, {"N": 4096})
    timer = CountingTimer(10.0)
    with PlanDB(tmp_path / "db.sqlite") as db:
        search = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=3), timer=timer)
        best = search.run().best
        assert best is not None
        search.measured.pop(best.key)  # as if its timing had failed
        calls = timer.calls
        search._store([best])
        assert timer.calls == calls
        search._time_finalists([best])
        assert timer.calls == calls + 1 and search.measured[best.key]["median_us"] == 110.0
        search._time_finalists([best])  # measured now: not timed again
        assert timer.calls == calls + 1
