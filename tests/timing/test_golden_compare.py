"""The golden check's relative error (habu/timing/harness.py `relative_error`): a matching infinity (a fully masked
row's maximum, −∞ in the model and the kernel) is equal; one the kernel does not match (−FLT_MAX) fails, where
before both read as NaN, which no test could tell apart."""

from __future__ import annotations

import numpy as np

from habu.timing.harness import Golden, relative_error


def test_a_matching_infinity_is_equal_and_left_out_of_the_norm():
    ref = np.array([1.0, 2.0, -np.inf])
    assert relative_error(np.array([1.0, 2.0, -np.inf]), ref) == 0.0
    got = np.array([1.0, 2.5, -np.inf])
    assert abs(relative_error(got, ref) - 0.5 / np.sqrt(5.0)) < 1e-12


def test_an_unmatched_infinity_is_an_infinite_error():
    ref = np.array([1.0, -np.inf])
    assert relative_error(np.array([1.0, -3.402823466e38]), ref) == float("inf")
    assert relative_error(np.array([1.0, np.inf]), ref) == float("inf")
    assert relative_error(np.array([np.inf, -np.inf]), ref) == float("inf")
    assert not Golden(relative_error(np.array([1.0, np.nan]), ref), 1e-2, 1).ok


def test_finite_values_compare_as_before():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(100)
    got = ref + 1e-3 * rng.standard_normal(100)
    want = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert abs(relative_error(got, ref) - want) < 1e-15
    assert relative_error(np.zeros(3), np.zeros(3)) == 0.0
