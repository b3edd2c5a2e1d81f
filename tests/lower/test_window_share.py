"""The cost model's view of a k window (habu/lower/window_share.py): the share of the k steps a windowed grid
runs."""

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


def test_a_causal_reader_runs_about_half_its_k_steps():
    sizes = {"M": 1024, "N": 1024, "K": 192, "E": 128}
    assert window_share(_values({"tile": "128x128x64"}, sizes), sizes) == 36 / 64  # row t runs 2(t + 1) of 16
    assert window_share(_values({"tile": "64x128x64"}, sizes), sizes) == 34 / 64  # row t runs t + 1 of 16


def test_the_cost_model_charges_a_windowed_product_its_share():
    from habu.search.cost import contraction_cost

    sizes = {"M": 1024, "N": 1024, "K": 192, "E": 128}
    skipped, full = _values({"tile": "128x128x64"}, sizes), _values({"tile": "128x128x64", "skip_zero": "false"}, sizes)
    c = T.ceilings
    assert contraction_cost(skipped, sizes, T, c).seconds < contraction_cost(full, sizes, T, c).seconds


def test_no_window_runs_every_k_step():
    sizes = {"M": 1024, "N": 1024, "K": 192, "E": 128}
    assert window_share(_values({"skip_zero": "false"}, sizes), sizes) == 1.0
