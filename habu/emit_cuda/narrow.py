"""Index tensors narrowed on the device in one launch (habu/memory/narrow.cuh).

A torch int64 index tensor handed to a kernel that reads i32 (or i16) is narrowed in stream order,
saturating (a value outside the narrower type stays out of every index range, and the kernel's index
check reports it). torch's `clamp` then `to` cost two dispatches (about 30 µs of host time a call on
the H200); this is one `cuLaunchKernel` with packed arguments whose pointers change per call.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

from habu.emit_cuda import driver

# (given type, kernel's type) -> (entry point, C types, saturation bounds)
_KERNELS = {
    ("i64", "i32"): ("habu_narrow_index_i64_i32", "long long", "int", -(1 << 31), (1 << 31) - 1),
    ("i64", "i16"): ("habu_narrow_index_i64_i16", "long long", "short", -(1 << 15), (1 << 15) - 1),
    ("i32", "i16"): ("habu_narrow_index_i32_i16", "int", "short", -(1 << 15), (1 << 15) - 1),
}
THREADS = 256


def narrowing_source() -> str:
    """The module of every narrowing kernel (compiled once per device architecture in a process)."""
    lines = ['#include "habu/memory/narrow.cuh"']
    for name, src, dst, lo, hi in _KERNELS.values():
        lines.append(f"HABU_NARROW_INDEX({name}, {src}, {dst}, {lo}LL, {hi}LL)")
    return "\n".join(lines) + "\n"


def can_narrow(given: str, kernel_type: str) -> bool:
    return (given, kernel_type) in _KERNELS


_modules: dict[tuple[int, str], driver.Module] = {}  # (device ordinal, arch) -> loaded module


def _module(dev: driver.Device) -> driver.Module:
    """The narrowing module in `dev`'s primary context (to be called with that context current)."""
    key = (dev.ordinal, dev.arch)
    if key not in _modules:
        from habu.emit_cuda.cache import compile_cached

        cubin, _hit = compile_cached(narrowing_source(), "habu_narrow_index_i64_i32", dev.arch)
        _modules[key] = driver.load_cubin(cubin)
    return _modules[key]


@dataclass
class NarrowLaunch:
    """One index tensor's narrowing: the loaded entry point and its packed (in, out, n) arguments."""

    tensor: str
    kernel_type: str
    count: int
    function: Any
    args: driver.KernelArgs

    @classmethod
    def make(cls, dev: driver.Device, tensor: str, given: str, kernel_type: str, count: int) -> NarrowLaunch:
        name = _KERNELS[(given, kernel_type)][0]
        fn = _module(dev).function(name)
        args = driver.KernelArgs([ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_int64(count)])
        return cls(tensor, kernel_type, count, fn, args)

    def launch(self, d: Any, source: int, target: int, stream: Any) -> Any:
        """Queue the narrowing of `source` into `target` on `stream` (a CUstream); the driver result."""
        self.args.values[0].value, self.args.values[1].value = source, target
        blocks = max(1, -(-self.count // THREADS))
        return d.cuLaunchKernel(self.function, blocks, 1, 1, THREADS, 1, 1, 0, stream, self.args.address, 0)


__all__ = ["NarrowLaunch", "can_narrow", "narrowing_source"]
