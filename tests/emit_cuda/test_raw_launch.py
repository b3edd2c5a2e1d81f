"""The GIL-keeping cuLaunchKernel (habu.emit_cuda.raw_launch): only for cuda-python's own driver module, its
arguments made once as ctypes objects."""

from __future__ import annotations

import ctypes

from habu.emit_cuda.raw_launch import arguments, raw_launcher
from tests.emit_cuda.fakes import FakeCuda


class _Function:
    def __int__(self) -> int:
        return 0xF00D


def test_a_stand_in_driver_gets_no_raw_launcher():
    assert raw_launcher(FakeCuda()) is None  # every launch of a faked call goes through the fake


def test_the_arguments_are_the_launch_as_ctypes_values():
    args = arguments((_Function(), 3, 2, 1, 384, 1, 1, 200_000), 0x5EED, 0x1234)
    assert len(args) == 11
    assert args[0].value == 0xF00D and [a.value for a in args[1:8]] == [3, 2, 1, 384, 1, 1, 200_000]
    assert args[8].value == 0x5EED and args[9].value == 0x1234 and args[10].value is None
    assert all(isinstance(a, ctypes.c_uint) for a in args[1:8])
    assert arguments((_Function(), 1, 1, 1, 32, 1, 1, 0), 0, 8)[8].value is None  # stream 0: the legacy default stream
