"""The local process pool: the same search as in one process, and a worker killed mid-task."""

from __future__ import annotations

import functools
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from habu.db import PlanDB
from habu.search.loop import Budget, Search
from habu.search.pool import InlineExecutor, ProcessExecutor, local_executor
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.search.test_search import model_of

GGEMM = ROOT / "examples" / "ggemm.habu"


def run(tmp_path, executor, name: str):
    model, sizes = model_of(GGEMM, {"M": 512, "N": 512, "K": 384})
    with PlanDB(tmp_path / f"{name}.sqlite") as db:
        result = Search(str(GGEMM), model, TARGETS["sm_90a"], sizes, db, Budget(trials=6), executor=executor).run()
        return result, [r.plan for r in db.get(result.key).records]


@functools.cache
def inline_reference() -> tuple:
    """`run` in this process (InlineExecutor), once per test process: the result every other executor
    must reproduce (here and in tests/cluster/test_ray.py; a trials-budget search is deterministic)."""
    return run(Path(tempfile.mkdtemp(prefix="habu-inline-")), InlineExecutor(), "inline")


def test_local_executor_choice():
    assert isinstance(local_executor(1), InlineExecutor)
    pool = local_executor(3)
    assert isinstance(pool, ProcessExecutor) and pool.parallelism == 3


def test_a_process_pool_finds_what_one_process_finds(tmp_path):
    one, one_plans = inline_reference()
    many, many_plans = run(tmp_path, ProcessExecutor(2), "pool")
    assert many.best == one.best and many_plans == one_plans
    assert (many.stats.verified, many.stats.pruned_rules, many.stats.pruned_field) == \
        (one.stats.verified, one.stats.pruned_rules, one.stats.pruned_field)


def test_a_pool_worker_killed_mid_task_costs_nothing(tmp_path):
    one, one_plans = inline_reference()
    pool = ProcessExecutor(2)
    killed: list[int] = []

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            pids = pool.worker_pids()
            if pids and pool.restarts == 0:
                time.sleep(1.0)  # workers are busy with their first candidates
                pids = pool.worker_pids()
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    result, plans = run(tmp_path, pool, "killed")
    t.join(5)
    assert killed and pool.restarts >= 1
    assert result.best == one.best and plans == one_plans and result.stats.failed == 0


class RecordingExecutor:
    """A concurrent executor (checks run in the driver, lazily)."""

    name = "recording"
    parallelism = 4
    concurrent = True

    def __init__(self, log: list[str]):
        self.log, self.inner = log, InlineExecutor()

    def submit(self, job, items):
        return self.inner.submit(job, items)

    def check(self, job, items):
        return self.submit(job, items).result()

    def close(self):
        pass


class LoggingTimer:
    info = {"gpu": "Fake GPU", "sm_count": 132, "arch": "sm_90a", "driver": "13.0"}  # noqa: RUF012

    def __init__(self, log: list[str]):
        self.log = log

    def measure(self, plan, cubins=None):
        from habu.timing.worker import Measurement

        self.log.append("time")
        k = plan["kernels"][0]
        t = 100.0 + k["stages"]
        return Measurement(True, median_us=t, p20_us=t, p80_us=t, samples_us=[t], golden={"O": {"ok": True}})

    def close(self):
        pass


@pytest.mark.slow
def test_the_next_batch_is_proven_while_this_one_is_timed(tmp_path, monkeypatch):
    """Batches are logged as the driver sends them, the rules' cheap pass included: a batch whose
    candidates all fail it never reaches the executor (the cluster candidates made one such batch
    and an executor-side log missed it)."""
    from habu.search.loop import Search as S

    model, sizes = model_of(GGEMM, {"M": 512, "N": 512, "K": 384})
    log: list[str] = []
    send = S._send

    def logged(self, batch):
        log.append(f"send {sum(e.startswith('send') for e in log) + 1}")
        return send(self, batch)

    monkeypatch.setattr(S, "_send", logged)
    with PlanDB(tmp_path / "db.sqlite") as db:
        # the region's 115,120 candidates take 6-7 s to enumerate and cost on a 2-core machine before the
        # first batch goes out: 8 s of budget left too little after them (failed after this stop's merges)
        # (16 s timed too few batches when the machine was loaded by other tests, session 32: 24 s)
        Search(str(GGEMM), model, TARGETS["sm_90a"], sizes, db, Budget(seconds=24), timer=LoggingTimer(log),
               executor=RecordingExecutor(log)).run()
    # the default plan alone (send 1, time), then region tuning: batches 3 and 4 go out before any
    # of batch 2 is timed (IN_FLIGHT batches at once), and batch n + IN_FLIGHT - 1 before batch n
    from habu.search.loop import IN_FLIGHT

    assert IN_FLIGHT == 3
    assert log[:5] == ["send 1", "time", "send 2", "send 3", "send 4"], log[:10]
    assert log.index("send 4") < log.index("time", 2) and log.count("time") > 4


class StepClock:
    """The search's clock for a test: it moves one second per plan timed and not otherwise, so a time
    budget ends after the same number of measurements however loaded the machine is. The proofs'
    deadline (wall-clock seconds, read by the workers) is put an hour away: none is abandoned."""

    def __init__(self):
        self.seconds = 0.0

    def monotonic(self) -> float:
        return self.seconds

    @staticmethod
    def time() -> float:
        return time.time() + 3600.0


class SteppingTimer(LoggingTimer):
    def __init__(self, log: list[str], clock: StepClock):
        super().__init__(log)
        self.clock = clock

    def measure(self, plan, cubins=None):
        self.clock.seconds += 1.0
        return super().measure(plan, cubins)


@pytest.mark.slow
def test_with_a_time_budget_the_pool_tunes_like_one_process(tmp_path, monkeypatch):
    """Sending ahead must not change what is found: the same candidates, in the same order. On the
    wall clock the budget's end fell at different places of the two runs and cut a batch of the pool's
    mid-way (CI, 2 loaded cores: a proof abandoned at the deadline while a later one of its batch was
    kept; and a run that timed one plan in 30 s): the search's clock here moves per plan timed."""
    import habu.search.budget
    import habu.search.loop

    model, sizes = model_of(GGEMM, {"M": 512, "N": 512, "K": 384})
    found = []
    for executor in (RecordingExecutor([]), ProcessExecutor(2)):
        clock = StepClock()
        monkeypatch.setattr(habu.search.loop, "time", clock)
        monkeypatch.setattr(habu.search.budget, "time", clock)
        with PlanDB(tmp_path / f"{executor.name}.sqlite") as db:
            search = Search(str(GGEMM), model, TARGETS["sm_90a"], sizes, db, Budget(seconds=30),
                            timer=SteppingTimer([], clock), executor=executor)
            search.stats.started = clock.monotonic()
            found.append(search.run().timeline)
    ta, tb = ([e["kernel"] for e in timeline] for timeline in found)
    n = min(len(ta), len(tb))
    assert n >= 20
    assert ta[:n] == tb[:n]


def test_regression_closing_the_pool_waited_for_proofs_still_running():
    """`habu search --budget 5m` on the H200 printed its winner at 316 s and was still closing
    at 330 s: the pool's shutdown waited for the batch sent ahead. Its workers also run niced,
    below the driver and the timing worker."""
    import os
    import time

    import pytest

    from habu.search.pool import ProcessExecutor

    ex = ProcessExecutor(2)
    pool = ex._ensure()
    futures = [pool.submit(time.sleep, 60) for _ in range(4)]
    deadline = time.monotonic() + 30

    def niced() -> bool:
        pids = ex.worker_pids()
        return len(pids) == 2 and all(os.getpriority(os.PRIO_PROCESS, pid) >= 10 for pid in pids)

    while not niced() and time.monotonic() < deadline:  # the initializer runs as each worker starts
        time.sleep(0.1)
    assert niced()
    pids = ex.worker_pids()
    started = time.monotonic()
    ex.close()
    assert time.monotonic() - started < 10
    assert len(futures) == 4
    for pid in pids:  # killed, not left running their proofs
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_regression_a_pool_closed_mid_result_left_the_interpreter_waiting_at_exit():
    """A pytest process that had passed the time-budget pool test waited at exit for over 9 minutes:
    `close` killed a worker while it sent a result (a candidate's cubins are large), the pool's
    manager thread waited for the rest of that message for ever, and the interpreter joins that
    thread at exit. Here the half-sent message is written into the result pipe by hand (the header
    of a megabyte, ten bytes of it); `close` must still end the manager thread."""
    import struct

    ex = ProcessExecutor(2)
    pool = ex._ensure()
    assert pool.submit(os.getpid).result(timeout=120) != os.getpid()  # the workers and the manager run
    manager = pool._executor_manager_thread
    os.write(pool._result_queue._writer.fileno(), struct.pack("!i", 1 << 20) + b"x" * 10)
    time.sleep(0.5)  # the manager is now reading the rest of the message
    ex.close()
    manager.join(timeout=20)
    assert not manager.is_alive()


def test_a_worker_killed_mid_result_breaks_its_pool_instead_of_hanging_the_batch():
    """The same half-sent result during a search: the pool's manager thread reads for ever, never
    notices the dead worker, and a batch without a deadline would wait for ever on the others. The
    batch's wait notices a dead worker the pool has not, stops the pool, and its futures fail as for
    any worker death (the batch then runs again in a new pool)."""
    import concurrent.futures as cf
    import struct

    from habu.search.pool import watched_result

    ex = ProcessExecutor(2)
    pool = ex._ensure()
    try:
        assert pool.submit(os.getpid).result(timeout=120) != os.getpid()
        pids = ex.worker_pids()
        sleeping = [pool.submit(time.sleep, 120) for _ in range(2)]
        time.sleep(0.5)
        os.write(pool._result_queue._writer.fileno(), struct.pack("!i", 1 << 20) + b"x" * 10)
        time.sleep(0.5)  # the manager is now reading the rest of the message
        os.kill(pids[0], signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises((cf.process.BrokenProcessPool, cf.CancelledError)):
            watched_result(pool, sleeping[1], None)
        assert time.monotonic() - started < 20
    finally:
        ex.close()


def test_workers_run_numpy_with_one_blas_thread(monkeypatch):
    """Regression: each worker ran OpenBLAS with a thread per core, so 15 workers on 16 cores
    oversubscribed the CPU tenfold and the finite-field check of RMSNorm + Linear took ~9 s."""
    import os

    from habu.search.pool import BLAS_THREAD_VARS, ProcessExecutor

    for var in BLAS_THREAD_VARS:
        monkeypatch.delenv(var, raising=False)
    ex = ProcessExecutor(workers=1)
    try:
        got = [ex._ensure().submit(os.getenv, var).result(timeout=120) for var in BLAS_THREAD_VARS]
    finally:
        ex.close()
    assert got == ["1"] * len(BLAS_THREAD_VARS)
