"""A candidate's NVRTC compile is bounded (habu.search.tasks.bounded_compile): one that hangs fails the
candidate (or abandons it at the deadline) instead of hanging the search."""

from __future__ import annotations

import time

import pytest

from habu.prove.deadline import DeadlinePassed, proof_deadline
from habu.search import tasks
from habu.search.space import default_plan
from habu.search.tasks import CompileTimeout, Job, bounded_compile, check_candidate
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

FUSED = ROOT / "examples" / "fused.habu"


def _never_finishes(*args, **kwargs):
    time.sleep(60)
    raise AssertionError("the compile was waited for")


def test_regression_a_hanging_nvrtc_compile_hung_the_search(monkeypatch):
    """check_candidate waited for NVRTC however long it took (a C call nothing interrupts): a compile
    that hangs hung the inline search, and a process pool without a deadline. Now it fails the
    candidate as a compile failure after COMPILE_TIMEOUT_S."""
    model = load_program(FUSED).models["AXPY-RELU"]
    plan = default_plan(model, TARGETS["sm_90a"])
    job = Job(FUSED.read_text(), str(FUSED), model.name, (), "sm_90a")
    monkeypatch.setattr(tasks, "compile_plan", _never_finishes)
    monkeypatch.setattr(tasks, "COMPILE_TIMEOUT_S", 0.5)
    start = time.perf_counter()
    result = check_candidate(job, plan.to_json(), seed=1, compile_kernels=True)
    assert time.perf_counter() - start < 20
    assert result["status"] == "compile" and "did not finish within" in result["reason"], result
    assert "certificate" in result  # proven: only the compile failed


def test_a_compile_past_the_proofs_deadline_abandons_the_candidate():
    start = time.perf_counter()
    with proof_deadline(time.time() + 0.3), pytest.raises(DeadlinePassed, match="NVRTC"):
        bounded_compile(_never_finishes, limit_s=30)
    assert time.perf_counter() - start < 5


def test_a_bounded_compile_returns_its_value_or_raises_its_error():
    assert bounded_compile(lambda: 7, limit_s=5) == 7

    def fails():
        raise ValueError("NVRTC log: error")

    with pytest.raises(ValueError, match="NVRTC log"):
        bounded_compile(fails, limit_s=5)
    with pytest.raises(CompileTimeout):
        bounded_compile(lambda: time.sleep(2), limit_s=0.2)
