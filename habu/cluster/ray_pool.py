"""The search on a Ray cluster: CPU tasks prove and compile candidates, one actor per GPU times them.

The driver (the `habu search` process) generates candidates, applies the cheap structural rules and
sends the rest out as Ray tasks (`check_candidate`: the z3 obligations, the finite-field check and,
when the plan will be timed, the NVRTC compile). Proven plans go, with their cubins, to `GpuActor`s
(`num_gpus=1`), each of which owns a `GpuTimer`: a worker process that golden-checks and times on
that actor's GPU and is restarted when a kernel faults or hangs. Results come back to the driver,
the only process that writes the plan database.

Faults: a task whose worker or node dies is retried by Ray (`max_retries`); an actor that dies is
restarted (`max_restarts`) and its call retried (`max_task_retries`); a candidate that still fails is
recorded as lost and the search goes on. A pool is homogeneous: actors are grouped by GPU name, SM
count, architecture, driver and Habu version, each group tunes its own database entry, and a
measurement that comes back from another kind of GPU (a node replaced under the same actor) is
refused rather than mixed in.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from habu.errors import UsageError
from habu.search.pool import (
    ABANDON_GRACE_S,
    ABANDONED,
    ExecutorLost,
    ExecutorLostInterrupt,
    Item,
    deadline_of,
)
from habu.search.tasks import Job, check_candidate_niced
from habu.timing.worker import GpuTimer, Measurement

# what makes two GPUs interchangeable for timing (and one database entry)
IDENTITY = ("gpu", "sm_count", "arch", "driver", "habu")


def ray_module():
    try:
        import ray
    except ImportError:
        raise UsageError("--ray needs Ray: pip install 'ray[default]'") from None
    return ray


# where `ray start --head` writes the address of the cluster it started (Ray's own convention; the
# `RAY_ADDRESS` variable, when set, comes first)
RAY_CURRENT_CLUSTER = Path("/tmp/ray/ray_current_cluster")
CONNECT_TIMEOUT_S = 5.0


def discovered_address() -> tuple[str, str]:
    """The address `--ray auto` joins, and where it was found: `RAY_ADDRESS`, else the file
    `ray start --head` writes. A `UsageError` when neither names one."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env and env not in ("auto", "local"):
        return env, "RAY_ADDRESS"
    try:
        text = RAY_CURRENT_CLUSTER.read_text().strip()
    except OSError:
        text = ""
    if text:
        return text.splitlines()[0].strip(), str(RAY_CURRENT_CLUSTER)
    raise UsageError(f"--ray auto: no Ray cluster to join (RAY_ADDRESS is not set and {RAY_CURRENT_CLUSTER} "
                     "does not exist); start one with cluster/start-head.sh, give its address (--ray HOST:PORT), "
                     "or use --ray local")


def reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> str | None:
    """None when something accepts a connection at HOST:PORT within `timeout_s`; else why not."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return f"not HOST:PORT ({address!r})"
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return None
    except TimeoutError:
        return f"no answer within {timeout_s:.0f} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def connect(address: str, timeout_s: float = CONNECT_TIMEOUT_S, **init: Any) -> None:
    """Start or join the Ray cluster for this search.

    "local": always a new cluster on this machine for this run (`address="local"`: never one that
    happens to run here). "auto": the address in `RAY_ADDRESS` or in the file `ray start --head`
    writes, nothing else. HOST:PORT: that cluster. The address must accept a connection within
    `timeout_s` (ray.init waits on a dead one, or on a stale file's, for minutes): else a
    `UsageError` that says where the address came from."""
    ray = ray_module()
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False} | init
    if address == "local":
        ray.init(address="local", **kwargs)
        return
    where, source = (address, "--ray") if address != "auto" else discovered_address()
    why = reachable(where, timeout_s)
    if why is not None:
        stale = f" (the address in {source}: a cluster that stopped leaves it behind)" if source != "--ray" else ""
        raise UsageError(f"--ray {address}: no Ray cluster answers at {where}{stale}: {why}; start one with "
                         "cluster/start-head.sh, or use --ray local")
    try:
        ray.init(address=where, **kwargs)
    except (ConnectionError, TimeoutError) as exc:
        raise UsageError(f"--ray {address}: could not join the Ray cluster at {where}: "
                         f"{str(exc).splitlines()[0][:300]}") from None


def cluster_lost(exc: BaseException) -> bool:
    """Does this error mean the driver lost its cluster (its local raylet, or the head's GCS)?"""
    ray = ray_module()
    return isinstance(exc, (ray.exceptions.LocalRayletDiedError, ray.exceptions.RaySystemError))


def lost_error(exc: BaseException) -> ExecutorLost:
    return ExecutorLost(f"the Ray cluster was lost ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})")


LOST: list[str] = []  # why the driver's cluster is gone (set by a ClusterWatch); empty while it is there


def check_lost() -> None:
    """Raise `ExecutorLost` when a `ClusterWatch` found the cluster gone (every wait on Ray here
    is sliced to a second or less and calls this between slices)."""
    if LOST:
        raise ExecutorLost(f"the Ray cluster was lost: {LOST[0]}")


class ClusterWatch:
    """Watches the driver's way to the cluster: the head's GCS and this node's raylet accept a
    connection every `interval_s` (a connection a second, a few µs of work). When one has not for
    `misses` checks in a row, `LOST` says why and the driver's next wait on Ray raises
    `ExecutorLost`. Ray's own driver exits with status 1 and nothing said soon after its node is
    marked dead (~15 s after its raylet dies, ~60 s after the GCS); the search ends first, with
    the best proven plan stored and its report written. (A signal alone does not do: `ray.wait`
    does not look at signals while its raylet is gone; hence the waits in slices.) The driver may
    also be far from its next wait, costing candidates for many seconds on a loaded machine: so,
    while `ARMED` (from the watch's start until the executor closes), the watch also interrupts the
    main thread (SIGUSR1, whose handler it installs) with `ExecutorLostInterrupt`."""

    def __init__(self, addresses: list[str], interval_s: float = 1.0, misses: int = 3):
        import threading

        self.addresses, self.interval_s, self.misses = addresses, interval_s, misses
        LOST.clear()
        self._handler = _install_interrupt_handler()
        ARMED[:] = [self._handler is not None]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="habu-cluster-watch", daemon=True)
        self._thread.start()

    @property
    def lost(self) -> str | None:
        return LOST[0] if LOST else None

    @staticmethod
    def of_this_driver(**kw: Any) -> ClusterWatch:
        """A watch on the connected cluster's GCS and on this node's raylet."""
        ray = ray_module()
        addresses = [ray.get_runtime_context().gcs_address]
        with contextlib.suppress(Exception):  # the raylet's port: not public API, so not required
            node = ray._private.worker.global_worker.node
            addresses.append(f"{node.node_ip_address}:{node.node_manager_port}")
        return ClusterWatch(addresses, **kw)

    def _run(self) -> None:
        missed: dict[str, int] = dict.fromkeys(self.addresses, 0)
        while not self._stop.wait(self.interval_s):
            for address in self.addresses:
                why = reachable(address, timeout_s=self.interval_s)
                missed[address] = 0 if why is None else missed[address] + 1
                if missed[address] >= self.misses:
                    LOST.append(f"{address} stopped answering ({why}, {self.misses} checks in a row)")
                    if ARMED and ARMED[0]:
                        import _thread

                        _thread.interrupt_main(INTERRUPT_SIGNAL)
                    return

    def stop(self) -> None:
        ARMED[:] = [False]
        self._stop.set()
        self._thread.join(timeout=2 * self.interval_s + 1)
        if self._handler is not None:
            with contextlib.suppress(ValueError):
                signal.signal(INTERRUPT_SIGNAL, self._handler[0])


INTERRUPT_SIGNAL = signal.SIGUSR1
ARMED: list[bool] = []  # [True] while a watch may interrupt the main thread (the search is running)


def _raise_lost(signum: int, frame: Any) -> None:
    if ARMED and ARMED[0]:
        ARMED[:] = [False]  # once: the search's own handling of the loss runs undisturbed
        raise ExecutorLostInterrupt(f"the Ray cluster was lost: {LOST[0] if LOST else 'the watch said so'}")


def _install_interrupt_handler() -> tuple[Any] | None:
    """SIGUSR1 raises `ExecutorLostInterrupt` in the main thread; (the previous handler,), or None
    when not called on the main thread (then only the waits notice a loss)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return (signal.signal(INTERRUPT_SIGNAL, _raise_lost),)
    except ValueError:
        return None


def identity(info: dict) -> tuple:
    return tuple(info.get(k) for k in IDENTITY)


def _check_remote():
    ray = ray_module()
    # Ray re-runs a task whose worker process or node died; a Python exception is a real answer
    return ray.remote(max_retries=3, retry_exceptions=False)(check_candidate_niced)


class RayExecutor:
    """Proofs and compiles as Ray tasks, one CPU each, across the cluster."""

    name = "ray"
    concurrent = True

    def __init__(self, task_timeout_s: float = 900.0) -> None:
        ray = ray_module()
        self.task_timeout_s = task_timeout_s
        self.parallelism = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._remote = _check_remote()
        self._job: tuple[Job, Any] | None = None

    def submit(self, job: Job, items: Sequence[Item]) -> _RayBatch:
        ray = ray_module()
        try:
            if self._job is None or self._job[0] != job:
                self._job = (job, ray.put(job))
            job_ref = self._job[1]
            refs = [self._remote.remote(job_ref, *item) for item in items]
        except Exception as exc:
            if cluster_lost(exc):
                raise lost_error(exc) from None
            raise
        return _RayBatch(refs, self.task_timeout_s, deadline_of(items))

    def check(self, job: Job, items: Sequence[Item]) -> list[dict]:
        return self.submit(job, items).result()

    def close(self) -> None:
        ARMED[:] = [False]  # the search is over: a loss found now must not interrupt its saving


class _RayBatch:
    """Check tasks running on the cluster. A task still running `timeout_s` after it was sent
    (z3 or a compile stuck) is cancelled and its candidate recorded as lost."""

    def __init__(self, refs: list[Any], timeout_s: float, budget_end: float | None = None):
        self.refs, self.deadline = refs, time.monotonic() + timeout_s
        self.timeout_s = timeout_s
        # the search's time budget ends (time.time() seconds): the tasks stop their proofs then;
        # one that does not is cancelled a little later and its candidate abandoned
        self.budget_end = budget_end
        if budget_end is not None:
            self.deadline = min(self.deadline, time.monotonic() + budget_end + ABANDON_GRACE_S - time.time())

    def done(self) -> bool:
        """Every task answered (or the batch's time is up): `result()` will not wait."""
        if time.monotonic() >= self.deadline:
            return True
        ready, _ = ray_module().wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def result(self) -> list[dict]:
        ray = ray_module()
        try:
            while True:  # in slices of a second: a lost cluster is noticed between them
                check_lost()
                left = self.deadline - time.monotonic()
                ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=max(0.0, min(1.0, left)))
                if len(ready) == len(self.refs) or left <= 1.0:
                    break
        except Exception as exc:
            if cluster_lost(exc):
                raise lost_error(exc) from None
            raise
        out = []
        for ref in self.refs:
            try:
                out.append(ray.get(ref, timeout=0.5))
            except ray.exceptions.GetTimeoutError:
                ray.cancel(ref, force=True)
                if self.budget_end is not None and time.time() >= self.budget_end:
                    out.append(dict(ABANDONED))
                else:
                    out.append({"status": "lost", "reason": f"no answer from the cluster in {self.timeout_s:.0f} s"})
            except ray.exceptions.RayError as exc:  # retries spent: the worker or node kept dying
                if cluster_lost(exc):  # not this task's node: the driver's own raylet or the head
                    raise lost_error(exc) from None
                out.append({"status": "lost", "reason": f"lost on the cluster after retries: {type(exc).__name__}: "
                                                        f"{str(exc).splitlines()[0][:300]}"})
        return out


class GpuActor:
    """Owns one GPU of the cluster (Ray sets CUDA_VISIBLE_DEVICES) through a GpuTimer worker."""

    def __init__(self, job: Job, timeout_s: float = 30.0, reps: int = 20):
        from habu.version import __version__

        self.timer = GpuTimer(job.source_name, job.model, dict(job.sizes), timeout_s=timeout_s, reps=reps,
                              source=job.source)
        started = self.timer.start()
        self.info = None if started is None else dict(started) | {"habu": __version__}
        self.reason = self.timer.unavailable

    def describe(self) -> dict:
        import os
        import socket

        where = {"node": socket.gethostname(), "pid": os.getpid()}
        return (self.info | where) if self.info else {"unavailable": self.reason} | where

    def measure(self, plan_json: dict, cubins: list | None) -> dict:
        m = self.timer.measure(plan_json, cubins)
        return {"measurement": asdict(m), "info": self.info}

    def baseline(self) -> tuple[str, dict] | None:
        found = self.timer.baseline()
        return None if found is None else (found[0], asdict(found[1]))

    def close(self) -> None:
        self.timer.close()


def gpu_actor_class(num_gpus: float = 1):
    ray = ray_module()
    return ray.remote(num_gpus=num_gpus, max_restarts=3, max_task_retries=2)(GpuActor)


class GpuPool:
    """Several interchangeable GPUs used as one timer by the search (`measure_many` keeps every
    actor busy; results come back in the order asked)."""

    def __init__(self, actors: list[Any], info: dict, hang_s: float = 120.0, start_s: float = 600.0,
                 retries: int = 2, poll_s: float = 5.0):
        self.actors = list(actors)
        # the actor's own worker times a plan out after 30 s; this catches an actor that hangs itself
        self.hang_s, self.start_s, self.retries, self.poll_s = hang_s, start_s, retries, poll_s
        self.info = {k: v for k, v in info.items() if k not in ("node", "pid")}
        self.lost: list[str] = []  # actors given up on, and why
        # the stream: plans by id(token) -> (token, plan); queued ids; calls running -> (plan id, or
        # None for an actor coming back after a restart; actor; when sent); actors free
        self._plans: dict[int, tuple[Any, tuple[dict, list | None]]] = {}
        self._attempts: dict[int, int] = {}
        self._queue: list[int] = []
        self._running: dict[Any, tuple[int | None, Any, float]] = {}
        self._free: list[Any] = list(self.actors)

    @property
    def width(self) -> int:
        """How many plans are timed at once."""
        return len(self.actors)

    def measure_many(self, plans: Sequence[tuple[dict, list | None]]) -> list[Measurement]:
        """Time each plan on some actor of the pool, all at once; results in the order asked."""
        tokens = [object() for _ in plans]
        self.submit(list(zip(tokens, plans, strict=True)))
        got: dict[int, Measurement] = {}
        while len(got) < len(tokens) and self.busy:
            for token, m in self.collect(self.poll_s):
                got[id(token)] = m
        return [got.get(id(t), Measurement(False, "not measured")) for t in tokens]

    # -- streaming: plans are queued as they are proven, results collected as they land
    @property
    def busy(self) -> bool:
        return self.backlog > 0

    @property
    def backlog(self) -> int:
        """Plans queued or being timed (the search keeps a few per GPU ahead)."""
        return len(self._queue) + sum(1 for i, _, _ in self._running.values() if i is not None)

    def submit(self, items: Sequence[tuple[Any, tuple[dict, list | None]]]) -> None:
        """Queue (token, (plan_json, cubins)) pairs; they start on actors as soon as one is free."""
        for token, plan in items:
            self._plans[id(token)] = (token, plan)
            self._attempts[id(token)] = 0
            self._queue.append(id(token))
        self._dispatch()

    def drop_queued(self) -> list[Any]:
        """Forget the plans not started yet (the budget ran out); their tokens."""
        dropped = [self._finish(i) for i in self._queue]
        self._queue.clear()
        return dropped

    def _finish(self, i: int) -> Any:
        """Forget plan i (answered, failed or dropped); its token."""
        self._attempts.pop(i, None)
        return self._plans.pop(i)[0]

    def collect(self, wait_s: float) -> list[tuple[Any, Measurement]]:
        """`_collect`; the driver's cluster lost: `ExecutorLost`."""
        try:
            return self._collect(wait_s)
        except Exception as exc:
            if cluster_lost(exc):
                raise lost_error(exc) from None
            raise

    def _collect(self, wait_s: float) -> list[tuple[Any, Measurement]]:
        """The (token, Measurement) pairs finished now, waiting up to `wait_s` (at most a second:
        a lost cluster is noticed between waits) for the first.

        An actor that dies mid-plan is restarted by Ray and the plan tried again (on whichever
        actor is free first, `retries` times); an actor that does not answer within `hang_s` is
        killed and restarted by us, and that plan is recorded as failed (a hang is not retried); an
        actor whose restarts are spent leaves the pool."""
        ray = ray_module()
        out: list[tuple[Any, Measurement]] = []
        self._dispatch()
        if not self._running:  # every actor is gone
            for i in self._queue:
                out.append((self._finish(i), Measurement(False, "no GPU actor is left in the pool: "
                                                                 + "; ".join(self.lost))))
            self._queue.clear()
            return out
        check_lost()
        done, _ = ray.wait(list(self._running), num_returns=1, timeout=min(wait_s, 1.0))
        if not done:
            out += self._kill_hung()
            return out
        done, _ = ray.wait(list(self._running), num_returns=len(self._running), timeout=0)
        for call in done:
            i, actor, sent = self._running.pop(call)
            try:
                answer = ray.get(call)
            except (ray.exceptions.LocalRayletDiedError, ray.exceptions.RaySystemError) as exc:
                raise lost_error(exc) from None
            except ray.exceptions.RayActorError as exc:
                if i is None:  # it did not come back: its restarts are spent
                    self._drop(actor, exc)
                    continue
                self._attempts[i] += 1
                if self._attempts[i] > self.retries:
                    died = self._attempts[i]
                    out.append((self._finish(i), Measurement(False, f"the GPU actor died {died} times while timing it")))
                else:
                    self._queue.insert(0, i)  # the candidate runs again, on another actor or this one restarted
                self._revive(actor)
                continue
            self._free.append(actor)
            if i is not None:
                m = self._accept(answer)
                m.seconds = (m.seconds or {}) | {"actor": time.monotonic() - sent}  # the call, Ray's part included
                out.append((self._finish(i), m))
        self._dispatch()
        return out

    def _dispatch(self) -> None:
        while self._queue and self._free:
            i = self._queue.pop(0)
            actor = self._free.pop(0)
            call = actor.measure.options(max_task_retries=0).remote(*self._plans[i][1])
            self._running[call] = (i, actor, time.monotonic())

    def _revive(self, actor: Any) -> None:
        """Wait (without blocking the others) for Ray to restart `actor`: it is free again when it answers."""
        self._running[actor.describe.options(max_task_retries=-1).remote()] = (None, actor, time.monotonic())

    def _drop(self, actor: Any, exc: BaseException | str) -> None:
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        self.lost.append(why)
        self.actors = [a for a in self.actors if a is not actor]
        self._free = [a for a in self._free if a is not actor]
        with contextlib.suppress(Exception):
            ray_module().kill(actor)

    def _kill_hung(self) -> list[tuple[Any, Measurement]]:
        """Kill the actors that sat on one plan longer than `hang_s` (a hung kernel, a wedged
        GPU): Ray restarts them; the plan is recorded as failed. An actor that takes longer than
        `start_s` to come back leaves the pool."""
        ray = ray_module()
        now = time.monotonic()
        out = []
        for call, (i, actor, sent) in list(self._running.items()):
            if i is not None and now - sent > self.hang_s:
                del self._running[call]
                out.append((self._finish(i),
                            Measurement(False, f"no answer from the GPU actor in {self.hang_s:.0f} s (a hung "
                                               "kernel?); the actor was killed and restarted")))
                ray.kill(actor, no_restart=False)
                self._revive(actor)
            elif i is None and now - sent > self.start_s:
                del self._running[call]
                self._drop(actor, f"did not come back within {self.start_s:.0f} s of a restart")
        return out

    def _accept(self, answer: dict) -> Measurement:
        info = answer.get("info") or {}
        if identity(info) != identity(self.info):
            got = f"{info.get('gpu')} ({info.get('sm_count')} SMs, driver {info.get('driver')})"
            want = f"{self.info.get('gpu')} ({self.info.get('sm_count')} SMs, driver {self.info.get('driver')})"
            return Measurement(False, f"refused: timed on {got}, but this entry is for {want}; "
                                      "timings from different GPUs are never mixed")
        return Measurement(**answer["measurement"])

    def measure(self, plan_json: dict, cubins: list | None = None) -> Measurement:
        return self.measure_many([(plan_json, cubins)])[0]

    def baseline(self) -> tuple[str, Measurement] | None:
        ray = ray_module()
        for actor in self.actors:
            try:
                found = ray.get(actor.baseline.remote())
            except ray.exceptions.RayActorError:
                continue
            return None if found is None else (found[0], Measurement(**found[1]))
        return None

    def close(self) -> None:
        ray = ray_module()
        for actor in self.actors:
            with contextlib.suppress(Exception):  # an actor already gone has nothing to close
                ray.get(actor.close.remote(), timeout=30)
            ray.kill(actor)
        self.actors = []


def gpu_pools(job: Job, actor_class: Any = None, count: int | None = None,
              wait_s: float = 600.0) -> tuple[list[GpuPool], list[str]]:
    """One actor per GPU of the cluster, grouped into homogeneous pools; and the actors that could
    not start (with why)."""
    ray = ray_module()
    n = count if count is not None else int(ray.cluster_resources().get("GPU", 0))
    if n == 0:
        return [], []
    cls = actor_class or gpu_actor_class()
    return group_actors([cls.remote(job) for _ in range(n)], wait_s)


def group_actors(actors: list[Any], wait_s: float = 600.0) -> tuple[list[GpuPool], list[str]]:
    """Ask each actor what GPU it has; one pool per kind; actors without a usable GPU are dropped."""
    ray = ray_module()
    deadline = time.monotonic() + wait_s
    infos = []
    problems = []
    for a in actors:
        try:
            infos.append(ray.get(a.describe.remote(), timeout=max(1.0, deadline - time.monotonic())))
        except Exception as exc:
            infos.append({"unavailable": f"{type(exc).__name__}: {exc}"})
    groups: dict[tuple, list[tuple[Any, dict]]] = {}
    for a, info in zip(actors, infos, strict=True):
        if "unavailable" in info:
            problems.append(f"{info.get('node', '?')}: {info['unavailable']}")
            ray.kill(a)
            continue
        groups.setdefault(identity(info), []).append((a, info))
    pools = [GpuPool([a for a, _ in members], members[0][1]) for members in groups.values()]
    return pools, problems


__all__ = ["LOST", "ClusterWatch", "GpuActor", "GpuPool", "RayExecutor", "check_lost", "cluster_lost", "connect",
           "discovered_address", "gpu_actor_class", "gpu_pools", "group_actors", "identity"]
