"""The tensor-core probe on the GPU: a ceiling no kernel of its tiling can beat, and a clock reading."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.mma_ceiling import measure  # noqa: E402


def test_the_probe_stays_under_the_tensor_core_peak_at_the_clock_it_read():
    r = measure(2048, 2048, 2048, reps=5)
    assert 500 < r["sm_mhz"] < 2500, r
    assert 0.3 < r["probe_of_peak"] <= 1.02, r  # above the peak would mean a wrong flop count or clock
