"""bf16 on the host: what `habu run` copies to the device is the value, never a float cast to bits."""

from __future__ import annotations

import numpy as np
import pytest

from habu.emit_cuda.arrays import ArgumentError
from habu.emit_cuda.driver import bf16_bits_to_float, float_to_bf16_bits, host_storage


def test_round_to_nearest_even():
    # 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties go to the even one (1)
    x = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 3.0e38, 1e-40], dtype=np.float32)
    back = bf16_bits_to_float(float_to_bf16_bits(x))
    assert back[0] == 1.0 and back[1] == 1.0 and back[2] == 1 + 2**-6 and back[3] == -2.5
    assert np.isfinite(back[4]) or back[4] == np.inf  # overflow rounds to inf like the hardware
    assert abs(back[5] - 1e-40) < 1e-41


def test_nan_stays_nan():
    assert np.isnan(bf16_bits_to_float(float_to_bf16_bits(np.array([np.nan], np.float32))))[0]


def test_random_values_round_within_half_an_ulp():
    x = np.random.default_rng(3).standard_normal(10000).astype(np.float32)
    err = np.abs(bf16_bits_to_float(float_to_bf16_bits(x)) - x) / np.abs(x)
    assert err.max() <= 2.0**-8  # half an ulp: 8 significant bits


def test_regression_habu_run_cast_float_inputs_to_bf16_bits_as_integers():
    stored = host_storage(np.array([[1.5, -2.0]], np.float64), "bf16")
    assert stored.dtype == np.uint16 and list(bf16_bits_to_float(stored)[0]) == [1.5, -2.0]
    bits = np.array([0x3FC0], np.uint16)  # already bf16 bits: kept
    assert host_storage(bits, "bf16")[0] == 0x3FC0
    with pytest.raises(ArgumentError):
        host_storage(np.array(["a"]), "bf16")
