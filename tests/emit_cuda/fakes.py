"""Stand-ins for GPU arrays and a small model with a two-kernel plan, for tests without a GPU."""

from __future__ import annotations

import contextlib
import ctypes
from types import SimpleNamespace

from habu.emit_cuda.arrays import ArrayInfo, row_major
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan, Param, TmaSpec
from habu.lower.access import VectorAccess
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Extent, Model, TensorDecl

BASE = 0x7F00_0000_0000  # a well-aligned fake device address


class FakeCAI:
    """An object that only has `__cuda_array_interface__` (no DLPack), like a numba device array."""

    def __init__(self, shape, typestr="<f4", ptr=BASE, strides=None, readonly=False, version=3):
        self.__cuda_array_interface__ = {"version": version, "shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, readonly), "strides": strides}


def info(shape, dtype="f32", ptr=BASE, device=0, strides=None, readonly=False) -> ArrayInfo:
    shape = tuple(shape)
    return ArrayInfo(ptr, shape, strides or row_major(shape), dtype, device, readonly)


def gemm_model() -> Model:
    """C[m n] = Σ k A[m k]·B[k n], with an index tensor IX over #S into #M."""
    extents = (Extent("M", 4096), Extent("K", None, 16, 65536, 16), Extent("N", None), Extent("S", None))
    inputs = (TensorDecl("A", ("M", "K"), DTYPES["bf16"]), TensorDecl("B", ("K", "N"), DTYPES["bf16"]),
              TensorDecl("IX", ("S",), DTYPES["i32"], range="M"))
    outputs = (TensorDecl("C", ("M", "N"), DTYPES["f32"]),)
    return Model("gemm", "equation", extents, inputs, outputs, (TensorDecl("T", ("M", "N"), None),), ())


def gemm_plan() -> EmittedPlan:
    """A loads through TMA, B with 8-element vectors (from a stand-in lowering), C and T plainly."""
    tma = TmaSpec("A", "bf16", ("K", "M"), (64, 128), 128)
    lowering = SimpleNamespace(  # what ContractionLowering.vector_accesses lists for such a plan
        vector_accesses=lambda: (VectorAccess("B", 8, "the plan loads B with 8-element vectors"),))
    k0 = CudaKernel("k0", "", (Param("tm_A", "tensormap", "A", "bf16", tma=tma), Param("p_B", "ptr", "B", "bf16"),
                               Param("p_T", "ptr", "T", "f32", writes=True), Param("p_IX", "ptr", "IX", "i32"),
                               Param("s_K", "size", extent="K"), Param("s_N", "size", extent="N")),
                    256, 0, lowering, zero=("T",))
    k1 = CudaKernel("k1", "", (Param("p_T", "ptr", "T", "f32"), Param("p_C", "ptr", "C", "f32", writes=True)),
                    128, 0, None)
    return EmittedPlan((k0, k1), (("T", "f32", ("M", "N")),))


def gemm_arrays(k: int = 512, n: int = 64, s: int = 32) -> dict[str, ArrayInfo]:
    return {"A": info((4096, k), "bf16"), "B": info((k, n), "bf16", BASE + 0x100000),
            "IX": info((s,), "i32", BASE + 0x200000)}


class FakeCuda:
    """The few driver entry points a packed call uses, recording what it was asked to do."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self):
        self.calls: list[tuple] = []

    def CUstream(self, handle):
        return ("stream", handle)

    def CUdeviceptr(self, ptr):
        return ptr

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, args, extra):
        self.calls.append(("launch", fn, (gx, gy, gz), stream, args))
        return (0,)

    def cuMemAllocAsync(self, nbytes, stream):
        self.calls.append(("alloc", nbytes))
        return (0, BASE + 0x2000_0000 + 0x100_0000 * len(self.calls))

    def cuMemFreeAsync(self, ptr, stream):
        return (0,)

    def cuMemsetD8Async(self, ptr, value, nbytes, stream):
        self.calls.append(("memset", ptr, nbytes, stream))
        return (0,)

    class CUevent_flags:
        CU_EVENT_DISABLE_TIMING = 2

    class CUstream_flags:
        CU_STREAM_NON_BLOCKING = 1

    def cuEventCreate(self, flags):
        self.calls.append(("event", flags))
        return (0, f"event{len(self.calls)}")

    def cuEventRecord(self, event, stream):
        self.calls.append(("record", event, stream))
        return (0,)

    def cuStreamWaitEvent(self, stream, event, flags):
        self.calls.append(("wait", stream, event))
        return (0,)

    def cuStreamCreateWithPriority(self, flags, priority):
        self.calls.append(("stream", flags, priority))
        return (0, 0x5EED)


class FakeTensorMap:
    """An encoded tensor map stand-in: remembers the address it was encoded for."""

    def __init__(self, address: int):
        self.address = address
        self._bytes = (ctypes.c_uint64 * 16)()

    def getPtr(self) -> int:
        return ctypes.addressof(self._bytes)


def fake_gpu(monkeypatch, runtime, driver) -> FakeCuda:
    """Route a CompiledModel's calls to a FakeCuda: one 132-SM sm_90a device, kernels 'loaded' as their
    names, output and intermediate allocations at fresh fake addresses, tensor maps recorded. Anything
    that would copy from the device or synchronise fails the test."""
    cuda = FakeCuda()
    real_grid = CudaKernel.grid
    dev = driver.Device(0, None, None, "sm_90a", 132)
    encoded: list[int] = []
    next_ptr = [BASE + 0x1000_0000]
    buffers: dict[tuple, list[int]] = {}

    class FakeDeviceArray:
        """Allocations as a caching allocator makes them in a loop: two buffers per shape, in turn."""

        def __init__(self, shape, dtype, dev):
            self.shape, self.dtype = tuple(shape), dtype
            pair = buffers.setdefault((self.shape, dtype), [next_ptr[0], next_ptr[0] + 0x100_0000, 0])
            next_ptr[0] += 0x200_0000 if pair[2] == 0 and pair[0] == next_ptr[0] else 0
            self.ptr = pair[pair[2] % 2]
            pair[2] += 1

        @property
        def info(self):
            return ArrayInfo(self.ptr, self.shape, row_major(self.shape), self.dtype, 0)

    def encode(args):
        encoded.append(args.address)
        return FakeTensorMap(args.address)

    def never(*args, **kwargs):
        raise AssertionError("the call path copied from the device or synchronised")

    monkeypatch.setattr(driver, "_driver", lambda: cuda)
    monkeypatch.setattr(driver, "init", lambda: cuda)
    monkeypatch.setattr(driver, "device", lambda ordinal=0: dev)
    monkeypatch.setattr(driver, "current", lambda d: contextlib.nullcontext(d))
    monkeypatch.setattr(driver, "allow_smem", lambda fn, nbytes, what: None)
    monkeypatch.setattr(driver, "overlaps_launches", lambda d: False)
    monkeypatch.setattr(driver, "encode_tensormap", encode)
    monkeypatch.setattr(driver, "DeviceArray", FakeDeviceArray)
    monkeypatch.setattr(runtime, "DeviceArray", FakeDeviceArray)
    monkeypatch.setattr(runtime, "launch", lambda kernel, fn, arrays, sizes, grid, stream=0, early=False:
                        cuda.calls.append(("launch", fn, grid, stream, None)) or True)
    monkeypatch.setattr(runtime, "memset_zero", lambda ptr, nbytes, stream=0: cuda.calls.append(("memset", ptr, nbytes)))
    monkeypatch.setattr(driver, "copy_to_host", never)
    monkeypatch.setattr(runtime, "resident_blocks", lambda kernel, fn, smem, dev: 132)
    monkeypatch.setattr(CudaKernel, "grid", lambda self, sizes, sm_count: (4, 1, 1) if self.lowering is None
                        or isinstance(self.lowering, SimpleNamespace) else real_grid(self, sizes, sm_count))
    monkeypatch.setattr(runtime.CompiledModel, "_functions",
                        lambda self, member, dev: [k.name for k in self.kernel_set.members[member][1].kernels])
    cuda.encoded = encoded  # type: ignore[attr-defined]
    return cuda
