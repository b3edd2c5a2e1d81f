"""A node lost mid-search (its raylet and every worker on it killed) costs only the candidates in
flight there: Ray runs those tasks again on the nodes left, and the search finds what one process
finds. Two nodes on this machine (ray.cluster_utils.Cluster), one removed while tasks run on it."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from habu.cluster.ray_pool import RayExecutor  # noqa: E402
from habu.search.pool import InlineExecutor  # noqa: E402
from tests.cluster.test_ray import _task_workers, search  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


def _busy_on(node) -> bool:
    """A check task is running on the node now: a task worker whose parent is the node's raylet."""
    raylet = node.all_processes["raylet"][0].process.pid
    return any(_parent(pid) == raylet for pid in _task_workers())


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_a_node_lost_mid_search_costs_only_the_candidates_in_flight(tmp_path):
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # enough candidates that tasks are still running on the second node when the remover looks
    # (with 6 the proofs were fast enough that a clean-clone CI run once found none there)
    trials = 24
    local, local_plans = search(tmp_path / "a", "local", InlineExecutor(), trials=trials)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False,
                                                            "object_store_memory": 100 << 20})
    doomed = cluster.add_node(num_cpus=2, object_store_memory=100 << 20)
    ray.init(address=cluster.address, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}})
    removed: list[float] = []
    raylet = doomed.all_processes["raylet"][0].process.pid

    def remover():
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                if _busy_on(doomed):
                    cluster.remove_node(doomed, allow_graceful=False)
                    removed.append(time.time())
                    return
            except Exception:
                pass
            time.sleep(0.01)

    try:
        t = threading.Thread(target=remover, daemon=True)
        t.start()
        remote, remote_plans = search(tmp_path / "b", "ray", RayExecutor(), trials=trials)
        t.join(10)
    finally:
        ray.shutdown()
        cluster.shutdown()
    assert removed, "no task was running on the second node to lose"
    assert not _running(raylet)  # the node was really gone while the search went on
    assert remote.best == local.best and remote_plans == local_plans and remote.stats.failed == 0
