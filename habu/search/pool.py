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
from collections.abc import Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Protocol

from habu.search.tasks import Job, check_candidate

# one candidate to check: (plan JSON, seed, the kernels to prove (None: all), compile it for timing?)
Item = tuple[dict, int, "tuple[int, ...] | None", bool]


class Executor(Protocol):
    name: str
    parallelism: int

    def check(self, job: Job, items: Sequence[Item]) -> list[dict]: ...

    def close(self) -> None: ...


class InlineExecutor:
    """Everything in the driver's process, one candidate after another."""

    name = "inline"
    parallelism = 1

    def check(self, job: Job, items: Sequence[Item]) -> list[dict]:
        return [check_candidate(job, *item) for item in items]

    def close(self) -> None:
        pass


class ProcessExecutor:
    """A pool of local worker processes (spawned: no CUDA or z3 state is inherited)."""

    name = "processes"

    def __init__(self, workers: int | None = None, retries: int = 3):
        self.parallelism = max(1, workers or os.cpu_count() or 1)
        self.retries = retries
        self.restarts = 0  # pools rebuilt after a worker died
        self._pool: cf.ProcessPoolExecutor | None = None

    def _ensure(self) -> cf.ProcessPoolExecutor:
        if self._pool is None:
            self._pool = cf.ProcessPoolExecutor(self.parallelism, mp_context=mp.get_context("spawn"))
        return self._pool

    def worker_pids(self) -> list[int]:
        """The live worker processes (for the tests that kill one)."""
        procs = getattr(self._pool, "_processes", None) or {}
        return [p.pid for p in procs.values() if p.is_alive()]

    def check(self, job: Job, items: Sequence[Item]) -> list[dict]:
        results: list[dict | None] = [None] * len(items)
        for attempt in range(self.retries + 1):
            todo = [i for i, r in enumerate(results) if r is None]
            if not todo:
                break
            pool = self._ensure()
            try:
                futures = {i: pool.submit(check_candidate, job, *items[i]) for i in todo}
            except BrokenProcessPool:
                futures = {}
            broken = not futures
            for i, fut in futures.items():
                try:
                    results[i] = fut.result()
                except BrokenProcessPool:
                    broken = True  # a worker died: this candidate runs again in a new pool
            if broken:
                self.restarts += 1
                self._discard()
                if attempt == self.retries:
                    for i in todo:
                        if results[i] is None:
                            results[i] = {"status": "lost", "reason": f"a worker process died {self.retries + 1} "
                                                                      "times while checking it"}
        return [r for r in results if r is not None]

    def _discard(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def local_executor(jobs: int | None) -> InlineExecutor | ProcessExecutor:
    """`--jobs 1`: in the driver; more: a process pool of that size (default: one per CPU)."""
    n = jobs if jobs is not None else (os.cpu_count() or 1)
    return InlineExecutor() if n <= 1 else ProcessExecutor(n)


__all__ = ["Executor", "InlineExecutor", "ProcessExecutor", "local_executor"]
