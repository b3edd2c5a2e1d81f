"""Reading arrays: the CUDA array interface, DLPack (read with ctypes), and type names."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from habu.emit_cuda.arrays import (
    ArgumentError,
    DLManagedTensor,
    DLManagedTensorVersioned,
    DLTensor,
    array_info,
    cai_dtype,
    dlpack_dtype,
    row_major,
)
from tests.emit_cuda.fakes import BASE, FakeCAI


@pytest.mark.parametrize("typestr, name", [("<f4", "f32"), ("<f2", "f16"), ("<f8", "f64"), ("<V2", "bf16"),
                                           ("|i1", "i8"), ("<i2", "i16"), ("<i4", "i32"), ("<i8", "i64"),
                                           ("|u1", "u8"), ("|b1", "bool")])
def test_cai_type_names(typestr, name):
    assert cai_dtype(typestr) == name


def test_cai_contiguous():
    a = array_info(FakeCAI((3, 5), "<V2", BASE + 64))
    assert (a.ptr, a.shape, a.strides, a.dtype, a.device, a.readonly) == (BASE + 64, (3, 5), (5, 1), "bf16", None, False)
    assert a.on_cuda and a.nbytes == 30


def test_cai_strides_are_bytes():
    a = array_info(FakeCAI((4, 6), "<f4", strides=(4, 16)))  # a transposed view
    assert a.strides == (1, 4)
    with pytest.raises(ArgumentError, match="not whole elements"):
        array_info(FakeCAI((4, 6), "<f4", strides=(24, 2)), "X")


def test_cai_readonly_and_version_2():
    assert array_info(FakeCAI((2,), readonly=True, version=2)).readonly


def test_not_an_array():
    with pytest.raises(ArgumentError) as exc:
        array_info([1, 2, 3], "X")
    assert exc.value.message.startswith("X: a list is not a GPU array")


def test_dlpack_from_numpy():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    a = array_info(x)
    assert (a.ptr, a.shape, a.strides, a.dtype, a.device_type) == (x.ctypes.data, (4, 6), (6, 1), "f32", "cpu")
    assert not a.on_cuda
    view = array_info(x[1:, 2:].T)
    assert view.ptr == x.ctypes.data + (6 + 2) * 4 and view.strides == (1, 6) and view.shape == (4, 3)


def test_dlpack_readonly_through_the_versioned_capsule():
    x = np.zeros(8, np.int16)
    x.flags.writeable = False
    a = array_info(x)
    assert a.readonly and a.dtype == "i16"


def test_dlpack_is_preferred_to_cai():
    x = np.zeros((2, 2), np.float16)

    class Both:
        __cuda_array_interface__ = FakeCAI((2, 2), "<f2").__cuda_array_interface__
        __dlpack__ = x.__dlpack__
        __dlpack_device__ = x.__dlpack_device__

    assert array_info(Both()).device_type == "cpu"


def test_legacy_dlpack_producer():
    x = np.ones((3,), np.int64)

    class Old:  # a producer from before DLPack 1.0: no max_version
        def __dlpack__(self, stream=None):
            return x.__dlpack__()

        def __dlpack_device__(self):
            return x.__dlpack_device__()

    a = array_info(Old())
    assert (a.ptr, a.dtype, a.shape) == (x.ctypes.data, "i64", (3,))


@pytest.mark.parametrize("code, bits, lanes, name", [(4, 16, 1, "bf16"), (2, 16, 1, "f16"), (2, 32, 1, "f32"),
                                                     (0, 32, 1, "i32"), (1, 8, 1, "u8"), (6, 8, 1, "bool"),
                                                     (2, 32, 4, "f32x4")])
def test_dlpack_type_names(code, bits, lanes, name):
    assert dlpack_dtype(code, bits, lanes) == name


def test_dlpack_struct_layout():
    """The DLPack ABI on 64-bit platforms: field offsets of dlpack.h."""
    assert ctypes.sizeof(DLTensor) == 48
    assert DLTensor.shape.offset == 24 and DLTensor.strides.offset == 32 and DLTensor.byte_offset.offset == 40
    assert DLManagedTensor.manager_ctx.offset == 48 and ctypes.sizeof(DLManagedTensor) == 64
    assert DLManagedTensorVersioned.flags.offset == 24 and DLManagedTensorVersioned.dl_tensor.offset == 32


def test_row_major():
    assert row_major((2, 3, 4)) == (12, 4, 1)
    assert row_major(()) == ()
