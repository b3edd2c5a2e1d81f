"""Which models get an automatic baseline (the torch equivalent is checked on the GPU, tests/gpu)."""

from __future__ import annotations

import pytest

from habu.spec.parser import load_program
from habu.timing.baselines import torch_baseline
from tests.conftest import ROOT


@pytest.mark.parametrize("example", ["rmsnorm.habu", "softmax.habu", "ffn_skip.habu", "rmsnorm_linear.habu",
                                     "fused.habu"])
def test_models_that_are_not_one_contraction_get_the_eager_baseline(example, monkeypatch):
    import habu.timing.torch_eager as eager

    monkeypatch.setattr(eager, "TorchEager", lambda model, sizes: sizes)  # no torch on CPU machines
    for model in load_program(ROOT / "examples" / example).models.values():
        text, _ = torch_baseline(model, {})
        assert text == eager.describe(model)
