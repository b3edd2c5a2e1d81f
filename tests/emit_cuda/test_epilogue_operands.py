"""An epilogue that names one of its inputs several times reads it once per element."""

from __future__ import annotations

from habu.bench.step_gemms_speed import GEMMS, model_text
from habu.paths.emit import emit_plan
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS


def test_regression_an_epilogue_naming_its_input_four_times_loads_it_once_per_element():
    """GELU's derivative in a wgmma epilogue names the pre-activation T three times here (four in the
    derived FFN backward); each name was printed as a load of its own, and the compiler kept them apart:
    the FFN-SKIP backward's contraction with that epilogue ran 1466 µs where its GEMM alone runs ~620
    (H200, 4096 tokens). Now each load is declared once per element (e0_*, e1_*: the pair's two columns), both
    read by one load of the pair (habu/lower/epilogue_pairs.py)."""
    gemm = next(g for g in GEMMS if g.name == "dg-gelu")
    model = parse_text(model_text(gemm, 256, 256, 512), "step.habu").models["STEP-DG-GELU"]
    plan = default_plan(model, TARGETS["sm_90a"], {})
    k = plan.kernels[0]
    assert (k.mma.value, k.store.value) == ("wgmma", "tma")
    source = emit_plan(model, plan, TARGETS["sm_90a"]).kernels[0].source
    assert source.count("habu::load_pair16(p_T") == 1 and "habu::load_bf16(p_T" not in source  # the pair, once
    assert "const float e0_0 = " in source and "const float e1_0 = " in source
