"""The distributed search on a local Ray cluster (two CPUs): the same winner as one process, a
worker killed mid-task, GPU actors grouped by kind, measurements from another GPU refused, and an
actor killed mid-measurement. With no GPU in the cluster, plans are stored unmeasured."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from habu.cluster.ray_pool import GpuPool, RayExecutor, group_actors  # noqa: E402
from habu.db import PlanDB  # noqa: E402
from habu.search.loop import Budget, Search  # noqa: E402
from habu.search.pool import InlineExecutor  # noqa: E402
from habu.search.tasks import Job  # noqa: E402
from habu.target import TARGETS  # noqa: E402
from habu.timing.worker import Measurement  # noqa: E402
from habu.version import __version__  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.search.test_pool import inline_reference  # noqa: E402
from tests.search.test_search import model_of  # noqa: E402

GGEMM = ROOT / "examples" / "ggemm.habu"
SHAPE = {"M": 512, "N": 512, "K": 384}


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, object_store_memory=200 << 20, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}})
    yield
    ray.shutdown()


def search(tmp_path, name, executor, timer=None, trials=6):
    model, sizes = model_of(GGEMM, SHAPE)
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(GGEMM), model, TARGETS["sm_90a"], sizes, db, Budget(trials=trials), timer=timer,
                        executor=executor).run()
        return result, [r.plan for r in db.get(result.key).records]


def test_the_distributed_search_finds_the_local_winner(cluster, tmp_path):
    local, local_plans = inline_reference()  # the same search in one process
    remote, remote_plans = search(tmp_path / "b", "ray", RayExecutor())
    assert remote.best == local.best and remote_plans == local_plans
    assert (remote.stats.verified, remote.stats.pruned_rules) == (local.stats.verified, local.stats.pruned_rules)
    assert not remote.measured  # no GPU in this cluster: ranked by the cost model, stored unmeasured


def _task_workers() -> list[int]:
    """Ray workers running a check_candidate task now (Ray names the process after the task)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if cmd.startswith(b"ray::check_candidate"):
                pids.append(int(d.name))
    return pids


def test_a_worker_killed_mid_task_is_retried_and_nothing_is_lost(cluster, tmp_path):
    local, local_plans = inline_reference()  # the same search in one process
    killed: list[int] = []

    def killer():
        deadline = time.time() + 120
        while time.time() < deadline and not killed:
            pids = _task_workers()
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
            time.sleep(0.02)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    remote, remote_plans = search(tmp_path / "b", "ray", RayExecutor())
    t.join(5)
    assert killed, "no task was running to kill"
    assert remote.best == local.best and remote_plans == local_plans and remote.stats.failed == 0


class FakeGpu:
    """A stand-in GPU actor (the cluster has no GPU): times a plan by a formula, reports a GPU."""

    def __init__(self, job, gpu: str = "Fake H200", sleep: float = 0.0):
        self.info = {"gpu": gpu, "sm_count": 132, "arch": "sm_90a", "driver": "13.0", "habu": __version__}
        self.sleep = sleep

    def describe(self):
        return self.info | {"node": "here", "pid": os.getpid()}

    def pid(self):
        return os.getpid()

    def measure(self, plan_json, cubins):
        if plan_json.get("hang"):
            time.sleep(3600)  # a kernel that never finishes, holding the actor
        time.sleep(self.sleep)
        k = plan_json["kernels"][0]
        t = 100.0 + k["stages"] + (k["tile_n"] != 256) * 10
        m = Measurement(True, median_us=t, p20_us=t, p80_us=t, samples_us=[t], golden={"O": {"ok": True}})
        return {"measurement": asdict(m), "info": self.info}

    def swap_gpu(self, gpu):
        self.info = self.info | {"gpu": gpu}

    def baseline(self):
        return None

    def close(self):
        pass


def fake_actor():
    return ray.remote(num_gpus=0, num_cpus=0, max_restarts=3, max_task_retries=2)(FakeGpu)


def job():
    model, sizes = model_of(GGEMM, SHAPE)
    return Job.of(str(GGEMM), model, sizes, "sm_90a")


def test_gpus_of_different_kinds_are_tuned_into_separate_entries(cluster, tmp_path):
    cls = fake_actor()
    j = job()
    pools, problems = group_actors([cls.remote(j), cls.remote(j, "Fake B200"), cls.remote(j)])
    assert not problems and sorted(len(p.actors) for p in pools) == [1, 2]
    keys = set()
    for pool in pools:
        result, _ = search(tmp_path, "pool", InlineExecutor(), timer=pool, trials=3)
        assert result.measured
        keys.add((result.key.target.gpu, result.key.digest()))
    assert {g for g, _ in keys} == {"Fake H200", "Fake B200"} and len(keys) == 2
    with PlanDB(tmp_path / "db.sqlite") as db:
        assert len(db.entries()) == 2


def test_the_stream_keeps_every_gpu_busy_and_keeps_the_fastest_plan(cluster, tmp_path):
    """Under a time budget, proven plans stream to the pool's actors as each batch lands and are
    taken as they come back; the winner is the fastest plan timed, and the run ends on time."""
    cls = fake_actor()
    j = job()
    (pool,), _ = group_actors([cls.remote(j, "Fake H200", 0.05) for _ in range(2)])
    submitted: list[int] = []
    submit = pool.submit
    pool.submit = lambda items: (submitted.append(len(items)), submit(items))[1]
    model, sizes = model_of(GGEMM, SHAPE)
    t0 = time.monotonic()
    with PlanDB(tmp_path / "db.sqlite") as db:
        # 40 s: the region's 158,162 candidates (115,120 before the L2 hints' fields) take 9-10 s to enumerate and
        # cost on a 2-core machine, and CI runs another test process beside this one (20 s timed 3 plans there; 30 s
        # timed 2 on a fresh clone's full run beside other work, session 61)
        result = Search(str(GGEMM), model, TARGETS["sm_90a"], sizes, db, Budget(seconds=40.0), timer=pool,
                        executor=RayExecutor()).run()
        stored = db.get(result.key).records
    assert time.monotonic() - t0 < 40.0 + 20.0
    st = result.stats
    # at least 3 timed (2 actors): the full suite on the 2-core CI machine once timed 3 where it asked 5
    assert submitted and st.timed >= 3 and st.failed == 0, st
    assert len(result.timeline) == st.timed
    fastest = min(e["median_us"] for e in result.timeline)
    assert st.best_us == fastest and stored[0].median_us == fastest
    assert st.spent.get("gpu actor", 0) > 0 and "driver waits for proofs" in st.spent


def test_a_measurement_from_another_gpu_is_refused(cluster):
    cls = fake_actor()
    j = job()
    a, b = cls.remote(j), cls.remote(j)
    (pool,), _ = group_actors([a, b])
    ray.get(b.swap_gpu.remote("Fake B200"))  # the node behind this actor was replaced
    plan = {"kernels": [{"stages": 4, "tile_n": 256}]}
    results = pool.measure_many([(plan, None)] * 4)
    refused = [m for m in results if not m.ok]
    assert refused and all("refused: timed on Fake B200" in m.reason for m in refused)
    assert any(m.ok for m in results)


def test_an_actor_killed_mid_measurement_is_restarted_and_nothing_is_lost(cluster):
    cls = fake_actor()
    j = job()
    actors = [cls.remote(j, "Fake H200", 1.0) for _ in range(2)]
    (pool,), _ = group_actors(actors)
    victim = ray.get(actors[0].pid.remote())
    plan = {"kernels": [{"stages": 4, "tile_n": 256}]}
    out: list = []
    t = threading.Thread(target=lambda: out.extend(pool.measure_many([(plan, None)] * 4)))
    t.start()
    time.sleep(0.5)  # both actors are inside measure()
    os.kill(victim, signal.SIGKILL)
    t.join(120)
    assert len(out) == 4 and all(m.ok and m.median_us == 104.0 for m in out)
    assert ray.get(actors[0].pid.remote()) != victim  # restarted in a new process


def test_a_hung_actor_is_killed_and_restarted_and_the_search_goes_on(cluster):
    cls = fake_actor()
    j = job()
    actors = [cls.remote(j, "Fake H200", 0.2) for _ in range(2)]
    (pool,), _ = group_actors(actors)
    pool.hang_s, pool.poll_s = 3.0, 0.2
    before = {ray.get(a.pid.remote()) for a in actors}
    plan = {"kernels": [{"stages": 4, "tile_n": 256}]}
    t0 = time.monotonic()
    out = pool.measure_many([(plan | {"hang": True}, None)] + [(plan, None)] * 5)
    assert time.monotonic() - t0 < 60
    assert not out[0].ok and "no answer from the GPU actor in 3 s" in out[0].reason
    assert all(m.ok and m.median_us == 104.0 for m in out[1:])
    assert len(pool.actors) == 2  # the hung one came back
    after = {ray.get(a.pid.remote()) for a in actors}
    assert len(before & after) == 1  # exactly one actor was restarted in a new process
    again = pool.measure_many([(plan, None)] * 4)
    assert all(m.ok for m in again)


def test_habu_search_ray_local_stores_unmeasured_plans_without_a_gpu(tmp_path):
    env = dict(os.environ, RAY_AUTH_MODE="disabled", HABU_DB=str(tmp_path / "db.sqlite"))
    r = subprocess.run([sys.executable, "-m", "habu", "search", str(GGEMM), "--shape", "M=512,N=512,K=384",
                        "--budget", "3", "--ray", "local", "-o", str(tmp_path / "out")],
                       capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    said = r.stdout + r.stderr  # results go to stdout, progress to stderr
    assert "Ray cluster: 1 node(s)" in said and "UNMEASURED" in said and "ray)" in said
    with PlanDB(tmp_path / "db.sqlite") as db:
        (entry,) = db.entries()
        assert entry.records[0].status == "unmeasured"


def test_gpu_pool_with_no_actor_left_says_so():
    pool = GpuPool([], {"gpu": "x"})
    (m,) = pool.measure_many([({"kernels": []}, None)])
    assert not m.ok and "no GPU actor is left" in m.reason


def test_a_check_task_that_never_answers_is_cancelled_and_recorded_as_lost(cluster):
    from habu.cluster.ray_pool import _RayBatch

    @ray.remote
    def stuck(seconds):
        time.sleep(seconds)
        return {"status": "verified"}

    t0 = time.monotonic()
    out = _RayBatch([stuck.remote(0.1), stuck.remote(3600)], timeout_s=3.0).result()
    assert time.monotonic() - t0 < 30
    assert out[0]["status"] == "verified"
    assert out[1]["status"] == "lost" and "no answer from the cluster in 3 s" in out[1]["reason"]
