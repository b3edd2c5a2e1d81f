"""Where the candidates' proofs and compiles run: in the driver itself, in a pool of local
processes, or (habu.cluster) in Ray tasks across machines. Every executor returns the results in
the order the candidates were given, so the search keeps the same plans whichever runs them.

A local worker killed mid-task (the OOM killer, a user's kill -9) breaks its pool; the pool is
rebuilt and the unfinished candidates run again, up to `retries` times, before the search is told.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import os
import time
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

from habu.errors import HabuError
from habu.search.tasks import Job, check_candidate, lower_priority
from habu.search.threads import BLAS_THREAD_VARS, BlasThreads

# one candidate to check: (plan JSON, seed, the kernels to prove (None: all), compile it for timing?,
# when its proof is abandoned (time.time() seconds; None: never), compile it to refuse a slow one (no GPU)?)
Item = tuple[dict, int, "tuple[int, ...] | None", bool, "float | None", bool]

# how long past the budget's end the driver still waits for a proof that did not stop by itself
# (the proofs look at the deadline between trials, kernels and k steps, z3 queries get the time left,
# and a compile is waited for until the deadline: habu.search.tasks.bounded_compile)
ABANDON_GRACE_S = 2.0


def deadline_of(items: Sequence[Item]) -> float | None:
    """When the last of these candidates' proofs is abandoned (None: never)."""
    ends = [item[4] if len(item) > 4 else None for item in items]
    return None if not ends or any(e is None for e in ends) else max(e for e in ends if e is not None)


ABANDONED = {"status": "abandoned", "reason": "the time budget ran out during its proof (the worker was stopped)",
             "seconds": {}}


class ExecutorLost(HabuError):
    """The machines running the proofs (or the driver's connection to them) are gone: the search
    ends now, keeping the plans proven so far (a Ray head or its raylet lost)."""


class ExecutorLostInterrupt(BaseException):
    """Raised in the main thread, wherever the search is, by a watch that found the cluster gone
    (`habu.cluster.ray_pool.ClusterWatch`): a long stretch of costing or rule checks never reaches
    the next wait on Ray, and Ray's driver exits (status 1, nothing said) about 15 s after its
    raylet died. A BaseException, so that no `except Exception` on the way swallows it."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Pending(Protocol):
    """Candidates sent out and being checked; `result()` waits for them (in the order sent)."""

    def result(self) -> list[dict]: ...


class Executor(Protocol):
    name: str
    parallelism: int
    concurrent: bool  # do sent batches run while the driver does other work (times the last one)?

    def submit(self, job: Job, items: Sequence[Item]) -> Pending: ...

    def check(self, job: Job, items: Sequence[Item]) -> list[dict]: ...

    def close(self) -> None: ...


class _Later:
    """A batch checked only when its result is asked for (the driver has no one else to run it)."""

    def __init__(self, job: Job, items: Sequence[Item]):
        self.job, self.items = job, list(items)

    def result(self) -> list[dict]:
        return [check_candidate(self.job, *item) for item in self.items]


class InlineExecutor:
    """Everything in the driver's process, one candidate after another, with one BLAS thread
    (the proofs' contractions are small: see habu.search.threads) until `close()`."""

    name = "inline"
    parallelism = 1
    concurrent = False  # nothing runs while the driver times: sending ahead gains nothing

    def __init__(self) -> None:
        self.blas: BlasThreads | None = None

    def submit(self, job: Job, items: Sequence[Item]) -> Pending:
        if self.blas is None:
            self.blas = BlasThreads(1)
        return _Later(job, items)

    def check(self, job: Job, items: Sequence[Item]) -> list[dict]:
        return self.submit(job, items).result()

    def close(self) -> None:
        if self.blas is not None:
            self.blas.restore()
            self.blas = None


class ProcessExecutor:
    """A pool of local worker processes (spawned: no CUDA or z3 state is inherited)."""

    name = "processes"
    concurrent = True

    def __init__(self, workers: int | None = None, retries: int = 3):
        self.parallelism = max(1, workers or os.cpu_count() or 1)
        self.retries = retries
        self.restarts = 0  # pools rebuilt after a worker died
        self._pool: cf.ProcessPoolExecutor | None = None

    def _ensure(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            # one BLAS thread per worker (the workers are the parallelism): left alone, each of 15
            # workers on a 16-core machine runs numpy with 16 OpenBLAS threads (the likely reason
            # a multi-kernel finite-field check took about 9 s on the H200's host, against 0.9 s
            # in one process). The workers are spawned, so they start with this environment; a
            # value the user set is kept.
            for var in BLAS_THREAD_VARS:
                os.environ.setdefault(var, "1")
            self._pool = cf.ProcessPoolExecutor(self.parallelism, mp_context=mp.get_context("spawn"),
                                                initializer=lower_priority)
        return self._pool

    def worker_pids(self) -> list[int]:
        """The live worker processes (for the tests that kill one)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return [p.pid for p in procs.values() if p.is_alive()]

    def submit(self, job: Job, items: Sequence[Item]) -> Pending:
        return _PoolBatch(self, job, items)

    def check(self, job: Job, items: Sequence[Item]) -> list[dict]:
        return self.submit(job, items).result()

    def _send(self, job: Job, items: Sequence[Item], todo: list[int]
              ) -> tuple[cf.ProcessPoolExecutor, dict[int, cf.Future] | None]:
        pool = self._ensure()
        try:
            return pool, {i: pool.submit(check_candidate, job, *items[i]) for i in todo}
        except BrokenProcessPool:
            return pool, None

    def _broken(self, pool: cf.ProcessPoolExecutor) -> None:
        """`pool` lost a worker: start a new one (once, however many batches were running in it)."""
        if self._pool is pool:
            self.restarts += 1
            self._discard()

    def _abandon(self, pool: cf.ProcessPoolExecutor) -> None:
        """Stop `pool`'s workers now (a proof ran past the budget); the next batch starts a new pool."""
        if self._pool is pool:
            self.close()

    def _discard(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        """Stop at once: proofs still running (a batch sent ahead when the budget ran out) are
        killed, not waited for."""
        if self._pool is not None:
            pool, self._pool = self._pool, None
            stop_pool(pool)
            pool.shutdown(wait=True)


def stop_pool(pool: cf.ProcessPoolExecutor) -> None:
    """Kill `pool`'s workers and let its manager thread end. A worker killed while it sent a result (a
    candidate's cubins are large) leaves half a message in the result pipe: the manager thread waits
    for the rest for ever (the pool never turns broken, and the interpreter joins that thread at exit).
    With the workers gone this process holds the pipe's only write end: closed, the manager reads an
    end of file, finds the pool broken and fails its futures."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # shutdown forgets them
    results = getattr(pool, "_result_queue", None)  # and this
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        if proc.is_alive():
            proc.kill()
    for proc in procs:
        proc.join(timeout=5)
    writer = getattr(results, "_writer", None)
    if writer is not None:
        writer.close()


# how often a batch waiting on the pool looks for a dead worker the pool has not noticed, and how long
# such a worker may stay unnoticed (the pool notices an ordinary death at once) before the pool is stopped
WATCH_S, UNNOTICED_S = 1.0, 3.0


def watched_result(pool: cf.ProcessPoolExecutor, fut: cf.Future, wait: float | None) -> dict:
    """`fut.result(timeout=wait)`, but a pool with a dead worker it has not noticed (killed while it
    sent a result: its manager thread is left reading) is stopped, so `fut` fails as for any worker
    death (BrokenProcessPool) and its batch runs again."""
    end = None if wait is None else time.monotonic() + wait
    unnoticed_since: float | None = None
    while True:
        step = WATCH_S if end is None else max(0.0, min(WATCH_S, end - time.monotonic()))
        try:
            return fut.result(timeout=step)
        except cf.TimeoutError:
            if end is not None and time.monotonic() >= end:
                raise
        procs = list((getattr(pool, "_processes", None) or {}).values())
        if getattr(pool, "_broken", False) or all(p.is_alive() for p in procs):
            unnoticed_since = None
        elif unnoticed_since is None:
            unnoticed_since = time.monotonic()
        elif time.monotonic() - unnoticed_since >= UNNOTICED_S:
            stop_pool(pool)  # its futures fail as its manager thread ends: once is enough
            unnoticed_since = None


class _PoolBatch:
    """A batch running in the process pool. A worker that dies breaks the pool: it is rebuilt and
    the batch's unfinished candidates are sent again, up to the executor's `retries`."""

    def __init__(self, executor: ProcessExecutor, job: Job, items: Sequence[Item]):
        self.executor, self.job, self.items = executor, job, list(items)
        self.results: list[dict | None] = [None] * len(self.items)
        self.sent = executor._send(job, self.items, list(range(len(self.items))))

    def result(self) -> list[dict]:
        ex = self.executor
        deadline = deadline_of(self.items)
        for attempt in range(ex.retries + 1):
            todo = [i for i, r in enumerate(self.results) if r is None]
            if not todo:
                break
            pool, futures = self.sent if attempt == 0 else ex._send(self.job, self.items, todo)
            broken = futures is None
            for i, fut in (futures or {}).items():
                wait = None if deadline is None else max(0.0, deadline + ABANDON_GRACE_S - time.time())
                try:
                    self.results[i] = watched_result(pool, fut, wait)
                except cf.TimeoutError:
                    # past the budget and the proof did not stop by itself: abandoned, not waited
                    # for; the pool is replaced (its workers killed) so nothing runs on
                    self.results[i] = dict(ABANDONED)
                    ex._abandon(pool)
                except (BrokenProcessPool, cf.CancelledError):
                    if deadline is not None and time.time() >= deadline:
                        self.results[i] = dict(ABANDONED)  # its pool was stopped at the budget's end
                        continue
                    broken = True  # a worker died: this candidate runs again in a new pool
            if broken:
                ex._broken(pool)
                if attempt == ex.retries:
                    for i in todo:
                        if self.results[i] is None:
                            self.results[i] = {"status": "lost", "reason": f"a worker process died {ex.retries + 1} "
                                                                           "times while checking it"}
        return [r for r in self.results if r is not None]


def local_executor(jobs: int | None) -> InlineExecutor | ProcessExecutor:
    """`--jobs 1`: in the driver; more: a process pool of that size. The default leaves one CPU
    to the driver (on a 2-core machine the driver alone is faster: 1.05 against 0.86 verified
    candidates per second for GGEMM)."""
    n = jobs if jobs is not None else (os.cpu_count() or 1) - 1
    return InlineExecutor() if n <= 1 else ProcessExecutor(n)


__all__ = ["Executor", "ExecutorLost", "InlineExecutor", "Pending", "ProcessExecutor", "local_executor", "lost_cause"]


def lost_cause(exc: BaseException | None) -> ExecutorLost | None:
    """The `ExecutorLost` this exception is or was raised from (Ray wraps an exception that a
    signal handler raises while it waits), or None. An `ExecutorLostInterrupt` in the chain counts:
    the watch's signal landing inside Ray's compiled `CoreWorker.wait` comes out of it as a
    `SystemError` ("returned a result with an exception set") caused by the interrupt."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, ExecutorLost):
            return exc
        if isinstance(exc, ExecutorLostInterrupt):
            return ExecutorLost(exc.message)
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None
