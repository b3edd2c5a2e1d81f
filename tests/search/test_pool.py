"""The local process pool: the same search as in one process, and a worker killed mid-task."""

from __future__ import annotations

import os
import signal
import threading
import time

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


def test_local_executor_choice():
    assert isinstance(local_executor(1), InlineExecutor)
    pool = local_executor(3)
    assert isinstance(pool, ProcessExecutor) and pool.parallelism == 3


def test_a_process_pool_finds_what_one_process_finds(tmp_path):
    one, one_plans = run(tmp_path, InlineExecutor(), "inline")
    many, many_plans = run(tmp_path, ProcessExecutor(2), "pool")
    assert many.best == one.best and many_plans == one_plans
    assert (many.stats.verified, many.stats.pruned_rules, many.stats.pruned_field) == \
        (one.stats.verified, one.stats.pruned_rules, one.stats.pruned_field)


def test_a_pool_worker_killed_mid_task_costs_nothing(tmp_path):
    one, one_plans = run(tmp_path, InlineExecutor(), "inline")
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
