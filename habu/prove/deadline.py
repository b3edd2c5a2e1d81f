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


__all__ = ["DeadlinePassed", "check_deadline", "proof_deadline"]
