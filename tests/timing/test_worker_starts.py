"""The timing worker's starts: a worker that cannot start is tried again, but not forever (a GPU
wedged by a hung kernel must not cost every later candidate a full start timeout)."""

from __future__ import annotations

import time

from habu.timing.worker import GpuTimer
from tests.conftest import ROOT


def test_a_timer_whose_worker_keeps_failing_to_start_fails_plans_at_once():
    # a model the source does not define: the worker fails to start on any machine, GPU or not
    timer = GpuTimer(str(ROOT / "examples" / "ggemm.habu"), "NO-SUCH-MODEL", {"M": 64, "N": 64, "K": 64})
    first = timer.measure({"kernels": []})
    second = timer.measure({"kernels": []})
    assert not first.ok and "could not start" in first.reason
    assert not second.ok and timer.failed_starts == 2
    t0 = time.monotonic()
    third = timer.measure({"kernels": []})
    assert time.monotonic() - t0 < 1.0  # no third start
    assert not third.ok and "failed to start 2 times in a row" in third.reason
    timer.close()
