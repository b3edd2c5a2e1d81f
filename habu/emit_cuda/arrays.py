"""What the runtime needs to know about an argument array, read from torch, DLPack or CAI objects.

`array_info` reads, in this order: a torch tensor (through torch itself: depending on its version,
torch's CAI has no bf16, writes bf16 as `<f2` like f16, or as `<V2`), an object with `__dlpack__`
(the DLTensor read with ctypes, the capsule left unconsumed so its producer frees it; DLPack names
bf16 exactly), and an object with `__cuda_array_interface__` (version 2 or 3; `<V2` is read as
bf16, the ml_dtypes spelling). A CAI object does not say its device: `device` is None until the
runtime asks the driver where the pointer lives.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import Any

from habu.errors import HabuError

ELEMENT_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "i8": 1, "i16": 2, "i32": 4, "i64": 8}


class ArgumentError(HabuError):
    """An argument passed to a compiled model does not match what the plan was proven for."""


@dataclass(frozen=True)
class ArrayInfo:
    """One argument: where its data is and how it is laid out."""

    ptr: int  # address of element [0, 0, ...]
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    dtype: str  # a Habu name (bf16, f32, i32, ...), or a description of a type Habu lacks
    device: int | None  # device ordinal; None: not yet known (CAI)
    readonly: bool = False
    device_type: str = "cuda"  # "cuda", "cuda_managed", or where else the data lives ("cpu", ...)

    @property
    def itemsize(self) -> int:
        return ELEMENT_BYTES.get(self.dtype, 0)

    @property
    def nbytes(self) -> int:
        n = self.itemsize
        for s in self.shape:
            n *= s
        return n

    @property
    def on_cuda(self) -> bool:
        return self.device_type in ("cuda", "cuda_managed")


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Contiguous row-major strides (in elements) of a shape."""
    out, n = [], 1
    for s in reversed(shape):
        out.append(n)
        n *= max(s, 1)
    return tuple(reversed(out))


# ----------------------------------------------------------------------------- torch

TORCH_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32", "float64": "f64", "int8": "i8",
                 "int16": "i16", "int32": "i32", "int64": "i64"}


def is_torch_tensor(obj: Any) -> bool:
    """True for a torch.Tensor; never imports torch (a tensor exists only if torch was imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _from_torch(t: Any) -> ArrayInfo:
    name = str(t.dtype).removeprefix("torch.")
    dev = t.device
    return ArrayInfo(int(t.data_ptr()), tuple(t.shape), tuple(t.stride()), TORCH_DTYPES.get(name, name),
                     dev.index if dev.type == "cuda" else None, False, dev.type)


# ----------------------------------------------------------------------------- DLPack


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


DL_DEVICE_TYPES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm",
                   13: "cuda_managed"}
DL_FLAG_READ_ONLY = 1
_DL_CODES = {0: "i", 1: "u", 2: "f", 4: "bf", 5: "c", 6: "bool"}

_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))


def dlpack_dtype(code: int, bits: int, lanes: int) -> str:
    """The Habu name of a DLPack type (kDLBfloat = 4 with 16 bits is bf16)."""
    if lanes != 1:
        return f"{_DL_CODES.get(code, f'code{code}_')}{bits}x{lanes}"
    if code == 6:
        return "bool"
    return f"{_DL_CODES.get(code, f'code{code}_')}{bits}"


def _dlpack_capsule(obj: Any) -> Any:
    dev_type, _ = obj.__dlpack_device__()
    kwargs: dict[str, Any] = {"stream": -1} if int(dev_type) in (2, 13) else {}  # -1: no synchronisation
    try:
        return obj.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # a producer older than DLPack 1.0
        return obj.__dlpack__(**kwargs)


def _from_dlpack(obj: Any) -> ArrayInfo:
    capsule = _dlpack_capsule(obj)
    name = _capsule_name(capsule)
    address = _capsule_pointer(capsule, name)
    readonly = False
    if name == b"dltensor_versioned":
        managed = DLManagedTensorVersioned.from_address(address)
        tensor, readonly = managed.dl_tensor, bool(managed.flags & DL_FLAG_READ_ONLY)
    elif name == b"dltensor":
        tensor = DLManagedTensor.from_address(address).dl_tensor
    else:
        raise ArgumentError(f"__dlpack__ returned a capsule named {name!r}, not a DLPack tensor")
    shape = tuple(tensor.shape[i] for i in range(tensor.ndim))
    strides = tuple(tensor.strides[i] for i in range(tensor.ndim)) if tensor.strides else row_major(shape)
    dt = tensor.dtype
    device_type = DL_DEVICE_TYPES.get(tensor.device.device_type, f"dlpack device {tensor.device.device_type}")
    return ArrayInfo((tensor.data or 0) + tensor.byte_offset, shape, strides,
                     dlpack_dtype(dt.code, dt.bits, dt.lanes), tensor.device.device_id, readonly, device_type)


# ----------------------------------------------------------------------------- CUDA array interface

_CAI_KINDS = {"f": "f", "i": "i", "u": "u", "b": "bool", "c": "c"}


def cai_dtype(typestr: str) -> str:
    """The Habu name of a CAI/numpy typestr: '<f4' is f32, '<V2' is bf16."""
    kind, size = typestr[1], int(typestr[2:] or 0)
    if kind == "V" and size == 2:
        return "bf16"
    if kind == "b":
        return "bool"
    return f"{_CAI_KINDS.get(kind, kind)}{size * 8}"


def _from_cai(obj: Any, what: str) -> ArrayInfo:
    cai = obj.__cuda_array_interface__
    shape = tuple(int(s) for s in cai["shape"])
    ptr, readonly = cai["data"]
    size = int(cai["typestr"][2:] or 1)
    if cai.get("mask") is not None:
        raise ArgumentError(f"{what}: masked arrays are not supported")
    if cai.get("strides") is None:
        strides = row_major(shape)
    else:
        if any(s % size for s in cai["strides"]):
            raise ArgumentError(f"{what}: strides {tuple(cai['strides'])} (bytes) are not whole elements")
        strides = tuple(int(s) // size for s in cai["strides"])
    return ArrayInfo(int(ptr or 0), shape, strides, cai_dtype(cai["typestr"]), None, bool(readonly))


def array_info(obj: Any, what: str = "argument") -> ArrayInfo:
    """Describe a torch tensor, a DLPack object or a CUDA-array-interface object (`what` names it in errors)."""
    if isinstance(obj, ArrayInfo):
        return obj
    if is_torch_tensor(obj):
        return _from_torch(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        try:
            return _from_dlpack(obj)
        except BufferError as exc:
            if not hasattr(obj, "__cuda_array_interface__"):
                raise ArgumentError(f"{what}: cannot be exported through DLPack: {exc}") from None
    if hasattr(obj, "__cuda_array_interface__"):
        return _from_cai(obj, what)
    raise ArgumentError(f"{what}: a {type(obj).__name__} is not a GPU array (pass a torch tensor, a cupy "
                        "array, or any object with __dlpack__ or __cuda_array_interface__)")


__all__ = ["ELEMENT_BYTES", "TORCH_DTYPES", "ArgumentError", "ArrayInfo", "array_info", "cai_dtype",
           "dlpack_dtype", "is_torch_tensor", "row_major"]
