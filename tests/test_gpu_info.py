"""Reading the GPU's description from the driver."""

from __future__ import annotations

import pytest

from habu.errors import UsageError
from habu.gpu_info import device_arch, device_name
from habu.target import target_named


@pytest.mark.parametrize("raw", [b"NVIDIA H200\x00\x00\x00garbage", "NVIDIA H200\x00" + "\x00" * 240,
                                 b"NVIDIA H200" + b" " * 3])
def test_gpu_name_padding_from_cuDeviceGetName_is_not_part_of_the_db_key(raw):
    assert device_name(raw) == "NVIDIA H200"


def test_regression_an_8_6_part_reports_sm_86_and_using_it_says_why_not():
    """The driver ran 8.6 parts as sm_80 while this module called them sm_86: now both say sm_86 is
    not described (99 KB of shared memory per block, not sm_80's 163 KB)."""
    assert (device_arch(9, 0), device_arch(8, 0), device_arch(8, 6)) == ("sm_90a", "sm_80", "sm_86")
    with pytest.raises(UsageError, match="99 KB"):
        target_named(device_arch(8, 6))
