"""The search times each finalist on two lanes too (habu/plan/lanes.py) where its kernels can run side by side, and
keeps the faster: the same kernels, bound to the same certificate."""

from __future__ import annotations

from typing import ClassVar

from habu.compile import bind_shape
from habu.db import PlanDB
from habu.search.loop import Budget, Search
from habu.spec.grad_program import with_backward
from habu.spec.parser import load_program
from habu.target import TARGETS
from habu.timing.worker import Measurement
from tests.conftest import ROOT

SIZES = {"B": 128, "D": 512, "H": 1024}


class LaneTimer:
    """Two lanes `gain` µs faster than one (negative: slower)."""

    info: ClassVar[dict] = {"gpu": "Fake GPU", "sm_count": 132, "arch": "sm_90a", "driver": "13.0"}

    def __init__(self, gain: float):
        self.gain, self.lanes = gain, []

    def measure(self, plan):
        self.lanes.append(plan.get("lanes", 1))
        t = 100.0 - self.gain * (plan.get("lanes", 1) == 2)
        return Measurement(True, median_us=t, p20_us=t, p80_us=t, samples_us=[t], golden={"dX": {"ok": True}})

    def close(self):
        pass


def search_ffn_backward(tmp_path, timer):
    path = ROOT / "examples" / "ffn_skip.habu"
    program = with_backward(load_program(path), "FFN-SKIP-GRAD")
    model = bind_shape(program.models["FFN-SKIP-GRAD"], SIZES)
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], SIZES, db, Budget(trials=2), timer=timer).run()
        return result, db.get(result.key).records


def test_two_lanes_that_are_faster_are_stored_first(tmp_path):
    timer = LaneTimer(10.0)
    _, records = search_ffn_backward(tmp_path, timer)
    assert 2 in timer.lanes and records[0].plan.get("lanes") == 2 and records[0].median_us == 90.0
    one = next(r for r in records if r.plan.get("lanes", 1) == 1)
    assert {k: v for k, v in records[0].plan.items() if k != "lanes"} == one.plan
    assert records[0].certificate["plan_key"] != one.certificate["plan_key"]
    assert {k: v for k, v in records[0].certificate.items() if k not in ("plan_key", "notes")} == \
        {k: v for k, v in one.certificate.items() if k not in ("plan_key", "notes")}
    assert "two lanes" in records[0].certificate["notes"][-1]


def test_two_lanes_that_are_slower_are_not_first(tmp_path):
    _, records = search_ffn_backward(tmp_path, LaneTimer(-10.0))
    assert records[0].plan.get("lanes", 1) == 1
