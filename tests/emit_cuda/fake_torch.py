"""A stand-in for the few parts of torch a packed call touches (tensors' layouts and pointers, the
caching allocator, the current device and stream), so the call path torch users take runs on a machine
without torch or a GPU. Install it with `install(monkeypatch)`."""

from __future__ import annotations

import sys
from types import ModuleType, SimpleNamespace

from habu.emit_cuda.arrays import row_major


class Dtype:
    def __init__(self, name: str, itemsize: int):
        self.name, self.itemsize = name, itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    __str__ = __repr__


class Device:
    def __init__(self, type: str = "cuda", index: int = 0):
        self.type, self.index = type, index


class Tensor:
    """A GPU tensor's metadata at a fake address."""

    def __init__(self, shape, dtype: Dtype, ptr: int, strides=None, device: Device | None = None):
        self.shape, self.dtype, self._ptr = tuple(shape), dtype, ptr
        self._strides = tuple(strides) if strides is not None else row_major(self.shape)
        self.device = device or Device()
        self.recorded: list = []

    def stride(self):
        return self._strides

    def get_device(self) -> int:
        return self.device.index if self.device.type == "cuda" else -1

    def data_ptr(self) -> int:
        return self._ptr

    def record_stream(self, stream) -> None:
        self.recorded.append(stream)


def install(monkeypatch, base: int = 0x7E00_0000_0000) -> ModuleType:
    """Put a fake `torch` in sys.modules; its `allocated` lists (shape, strides, dtype name) of every
    tensor its allocator made, each at a fresh address."""
    torch = ModuleType("torch")
    dtypes = {"bfloat16": 2, "float16": 2, "float32": 4, "float64": 8, "int8": 1, "int16": 2, "int32": 4,
              "int64": 8}
    for name, size in dtypes.items():
        setattr(torch, name, Dtype(name, size))
    allocated: list[tuple] = []
    next_ptr = [base]

    def empty_strided(shape, strides, dtype=None, device=None):
        allocated.append((tuple(shape), tuple(strides), dtype.name))
        next_ptr[0] += 0x100_0000
        return Tensor(shape, dtype, next_ptr[0], strides)

    def empty(shape, dtype=None, device=None):
        return empty_strided(shape, row_major(tuple(shape)), dtype, device)

    torch.Tensor = Tensor
    torch.device = Device
    torch.empty_strided, torch.empty = empty_strided, empty
    torch.allocated = allocated
    torch._C = SimpleNamespace(_cuda_getDevice=lambda: 0, _cuda_getCurrentRawStream=lambda ordinal: 0x5EED)
    torch.cuda = SimpleNamespace(current_device=lambda: 0,
                                 current_stream=lambda ordinal=0: SimpleNamespace(cuda_stream=0x5EED))
    monkeypatch.setitem(sys.modules, "torch", torch)
    return torch
