"""A wall-clock deadline that a proof gives up at (the search's time budget, inside the proof).

The search gives each candidate the time its budget ends (seconds since the epoch, so a worker
process or a Ray task on another machine reads the same instant); the finite-field check and the
interpreter look at it between trials, kernels and k steps and raise `DeadlinePassed`, which the
candidate's task reports as "abandoned". Without a deadline (`habu compile`, a trials budget) nothing
is ever abandoned.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

_deadline: float | None = None  # seconds since the epoch; one proof at a time per process


class DeadlinePassed(Exception):
    """The proof ran past its deadline and was abandoned."""


@contextmanager
def proof_deadline(at: float | None) -> Iterator[None]:
    """Proofs run in this block give up at `at` (time.time() seconds; None: never)."""
    global _deadline
    before, _deadline = _deadline, at
    try:
        yield
    finally:
        _deadline = before


def check_deadline(where: str = "") -> None:
    """Raise `DeadlinePassed` when the current proof's deadline has passed."""
    if _deadline is not None and time.time() >= _deadline:
        raise DeadlinePassed(f"the time budget ran out{' ' + where if where else ''}")


def seconds_left() -> float | None:
    """Seconds until the current proof's deadline (None: no deadline; ≤ 0: passed)."""
    return None if _deadline is None else _deadline - time.time()


def solver_timeout_ms(limit_ms: int) -> int:
    """The timeout to give a solver (z3) now: `limit_ms`, or less when the current proof's deadline
    is nearer. `DeadlinePassed` when it has passed already (nothing is left to give it)."""
    check_deadline("before a z3 query")
    if _deadline is None:
        return limit_ms
    left = int((_deadline - time.time()) * 1000)
    if left <= 0:
        raise DeadlinePassed("the time budget ran out before a z3 query")
    return max(1, min(limit_ms, left))


def deadline_cut(limit_ms: int, given_ms: int) -> bool:
    """Whether a solver that gave up under `given_ms` was cut short by the deadline (not by its own
    `limit_ms`): then the answer is "abandoned", never "violated"."""
    return given_ms < limit_ms and _deadline is not None and time.time() >= _deadline - 0.001


__all__ = ["DeadlinePassed", "check_deadline", "deadline_cut", "proof_deadline", "seconds_left", "solver_timeout_ms"]
