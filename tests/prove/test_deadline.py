"""A proof's deadline bounds z3 too: a query gets at most the time left (habu/prove/deadline.py)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import z3

from habu.prove.deadline import DeadlinePassed, proof_deadline, solver_timeout_ms
from habu.prove.obligation import Z3_TIMEOUT_MS, Obligation, Rule, discharge

HARD = Rule("hard", "a statement z3 cannot settle quickly", "a test")


def _fermat_cubes() -> Obligation:
    """x³ + y³ ≠ z³ over 1..10^6 (true, and nonlinear: z3 does not decide it in seconds)."""
    x, y, z = z3.Ints("x y z")
    f = z3.Implies(z3.And(x >= 1, y >= 1, z >= 1, x <= 10**6, y <= 10**6, z <= 10**6), x * x * x + y * y * y != z * z * z)
    return Obligation(HARD, "kernel 0 (Y)", None, "no cube is a sum of two cubes", f)


def _ctx() -> SimpleNamespace:
    return SimpleNamespace(domain=[], model=SimpleNamespace(extents=()), ext={})


def test_the_solver_timeout_is_the_time_left_before_the_deadline():
    assert solver_timeout_ms(Z3_TIMEOUT_MS) == Z3_TIMEOUT_MS  # no deadline
    with proof_deadline(time.time() + 2.0):
        assert 1000 < solver_timeout_ms(Z3_TIMEOUT_MS) <= 2000
    with proof_deadline(time.time() + 60.0):
        assert solver_timeout_ms(Z3_TIMEOUT_MS) == Z3_TIMEOUT_MS
    with proof_deadline(time.time() - 1.0), pytest.raises(DeadlinePassed):
        solver_timeout_ms(Z3_TIMEOUT_MS)


def test_regression_z3_ignored_the_proofs_deadline():
    """z3 ran each query for up to 10 s whatever the search's budget had left, and an undecided
    query past the deadline was recorded as violated: now z3 gets the time left and a query the
    deadline cut short abandons the proof (the candidate's task reports "abandoned")."""
    start = time.perf_counter()
    with proof_deadline(time.time() + 0.5), pytest.raises(DeadlinePassed, match="z3 query"):
        discharge(_fermat_cubes(), _ctx())  # type: ignore[arg-type]
    assert time.perf_counter() - start < 5.0
    # not remembered as an answer: a later proof with time to spare asks z3 again
    ob = _fermat_cubes()
    with proof_deadline(time.time() - 1.0), pytest.raises(DeadlinePassed):
        discharge(ob, _ctx())  # type: ignore[arg-type]
    assert ob.status == "open"
