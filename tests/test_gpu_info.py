"""Reading the GPU's description from the driver."""

from __future__ import annotations

import pytest

from habu.gpu_info import device_name


@pytest.mark.parametrize("raw", [b"NVIDIA H200\x00\x00\x00garbage", "NVIDIA H200\x00" + "\x00" * 240,
                                 b"NVIDIA H200" + b" " * 3])
def test_gpu_name_padding_from_cuDeviceGetName_is_not_part_of_the_db_key(raw):
    assert device_name(raw) == "NVIDIA H200"
