"""The step-contraction bench's models and its torch baseline agree with each other on the CPU: each model
parses, its float64 meaning equals the baseline's product of the same stored arrays, and its default plan
exists (the GPU run is the bench itself)."""

from __future__ import annotations

import numpy as np
import pytest

from habu.bench.step_gemms_speed import GEMMS, model_text, parse_pins
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.spec.reference import evaluate
from habu.target import TARGETS


@pytest.mark.parametrize("gemm", GEMMS, ids=lambda g: g.name)
def test_each_step_contraction_means_what_its_torch_baseline_computes(gemm):
    model = parse_text(model_text(gemm, 8, 16, 24), "step.habu").models[f"STEP-{gemm.name.upper()}"]
    sizes = {e.name: e.size for e in model.extents}
    rng = np.random.default_rng(0)
    a = rng.integers(-3, 4, [sizes[x] for x in gemm.a_axes]).astype(np.float64)
    b = rng.integers(-3, 4, [sizes[x] for x in gemm.b_axes]).astype(np.float64)
    t = rng.normal(size=[sizes[x] for x in gemm.t_axes]) if gemm.t_axes else None
    want = evaluate(model, {"A": a, "W": b} | ({"T": t} if gemm.t_axes else {}))["O"]
    np.testing.assert_allclose(gemm.torch_product(a, b, t), want, rtol=1e-12, atol=1e-12)
    plan = default_plan(model, TARGETS["sm_90a"], {})
    assert plan.kernels[0].kind == "contraction" and len(plan.kernels) == 1  # an epilogue, fused


def test_pin_variants_parse_and_keep_the_default_once():
    assert parse_pins("") == [{}]
    assert parse_pins("persistent=true;tile=128x128x64,stages=5;") == [
        {"persistent": "true"}, {"tile": "128x128x64", "stages": "5"}, {}]
