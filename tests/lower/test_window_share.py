"""The cost model's view of a k window (habu/lower/window_share.py): the share of the k steps a windowed grid
runs, and its time against the unwindowed grid's, bounded by its longest tile."""

from __future__ import annotations

from habu.lower import lower_plan
from habu.lower.contraction import ContractionLowering
from habu.lower.window_share import window_share
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
PROGRAM = load_program(ROOT / "tests" / "data" / "causal_chain.habu")


def _values(pins: dict[str, str], sizes: dict[str, int]) -> ContractionLowering:
    model = PROGRAM.models["CAUSAL-CHAIN"].with_sizes(sizes)
    plan = default_plan(model, T, sizes, pins)
    return [lw for lw in lower_plan(model, plan) if isinstance(lw, ContractionLowering)][1]


def test_a_grid_of_one_wave_gains_nothing_while_its_last_tile_runs_every_k_tile():
    lw = _values({"tile": "128x128x64"}, {"M": 1024, "N": 1024, "E": 128})  # 8 tiles: all at once
    share, time = window_share(lw, {"M": 1024, "N": 1024, "K": 192, "E": 128}, 132)
    assert share == 36 / 64  # tile row t runs 2(t + 1) of 16 k tiles
    assert time == 1.0


def test_many_small_tiles_spread_the_saved_steps():
    sizes = {"M": 4096, "N": 4096, "K": 192, "E": 2048}
    lw = _values({"tile": "128x128x64"}, sizes)  # 32 × 16 tiles of 64 k tiles, the row t running 2(t + 1)
    share, time = window_share(lw, sizes, 132)
    assert abs(share - 33 / 64) < 1e-9
    assert time == 16 * 1056 / 132 / (4 * 64)  # the steps over the SMs, against 4 waves of 64


def test_no_window_costs_as_before():
    lw = _values({"skip_zero": "false"}, {"M": 1024, "N": 1024, "E": 128})
    assert window_share(lw, {"M": 1024, "N": 1024, "K": 192, "E": 128}, 132) == (1.0, 1.0)
