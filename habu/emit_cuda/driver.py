"""The CUDA driver API, as the runtime uses it: devices, modules, tensor maps, launches, memory.

Every call goes through `check`, which turns a failing CUresult into a DriverError carrying the
error's name. Kernel arguments are passed to cuLaunchKernel as a ctypes array of pointers, one
per parameter, each pointing at the parameter's bytes: a 64-bit address, an int64 size, or the
128-byte CUtensorMap encoded on the host.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from habu.emit_cuda.arrays import ELEMENT_BYTES, ArgumentError, ArrayInfo, row_major
from habu.emit_cuda.kernel import CudaKernel, TmaSpec
from habu.errors import HabuError, UsageError
from habu.targets import target_for_capability, target_named

DEFAULT_SMEM_LIMIT = 48 * 1024  # dynamic shared memory a kernel gets without opting in
NUMPY_STORAGE = {"bf16": "uint16", "f16": "float16", "f32": "float32", "f64": "float64", "i8": "int8",
                 "i16": "int16", "i32": "int32", "i64": "int64"}


class DriverError(HabuError):
    """A CUDA driver call failed."""


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise DriverError(f"cuda-python is not installed ({exc}): `pip install cuda-python`") from None
    return driver


def _text(b: Any) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else str(b)


def check(result: Any, what: str) -> Any:
    """The values a driver call returned after its CUresult; DriverError when it is not CUDA_SUCCESS."""
    d = _driver()
    err, values = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
    if err != d.CUresult.CUDA_SUCCESS:
        name, text = d.cuGetErrorName(err)[1], d.cuGetErrorString(err)[1]
        raise DriverError(f"{what} failed: {_text(name)} ({_text(text)})")
    return values[0] if len(values) == 1 else (values or None)


def init() -> Any:
    """cuInit; DriverError when the driver library is missing or has no usable device."""
    d = _driver()
    try:
        result = d.cuInit(0)
    except Exception as exc:  # the driver library itself cannot be loaded
        raise DriverError(f"the CUDA driver cannot be loaded: {exc}") from None
    check(result, "cuInit")
    return d


def device_count() -> int:
    """CUDA devices visible here; 0 when there is no driver or no device."""
    try:
        d = init()
        return int(check(d.cuDeviceGetCount(), "cuDeviceGetCount"))
    except Exception:
        return 0


def arch_for(major: int, minor: int) -> str:
    """The Habu target of a device's compute capability (`habu.targets.target_for_capability`: 8.6
    is not sm_80, whose shared-memory limit it does not have)."""
    try:
        return target_for_capability(major, minor)
    except UsageError as exc:
        raise DriverError(exc.message) from None


@dataclass(frozen=True)
class Device:
    """A CUDA device and its primary context."""

    ordinal: int
    handle: Any
    context: Any
    arch: str
    sm_count: int


@cache
def device(ordinal: int = 0) -> Device:
    """Device `ordinal`: its primary context (retained for the process), its target and SM count."""
    d = init()
    dev = check(d.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")

    def attribute(name: str) -> int:
        value = getattr(d.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(check(d.cuDeviceGetAttribute(value, dev), f"cuDeviceGetAttribute({name})"))

    ctx = check(d.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
    arch = arch_for(attribute("COMPUTE_CAPABILITY_MAJOR"), attribute("COMPUTE_CAPABILITY_MINOR"))
    return Device(ordinal, dev, ctx, arch, attribute("MULTIPROCESSOR_COUNT"))


@contextmanager
def current(dev: Device) -> Iterator[Device]:
    """Make the device's primary context current for the block (torch and cupy use the same one)."""
    d = _driver()
    check(d.cuCtxPushCurrent(dev.context), "cuCtxPushCurrent")
    try:
        yield dev
    finally:
        check(d.cuCtxPopCurrent(), "cuCtxPopCurrent")


def pointer_device(ptr: int) -> int:
    """The ordinal of the device a pointer's memory lives on."""
    d = init()
    attr = d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(check(d.cuPointerGetAttribute(attr, d.CUdeviceptr(ptr)), f"cuPointerGetAttribute({ptr:#x})"))


# ----------------------------------------------------------------------------- modules


class Module:
    """A cubin loaded into the current context, and its functions."""

    def __init__(self, image: bytes):
        d = _driver()
        self.handle = check(d.cuModuleLoadData(image), "cuModuleLoadData")
        self._functions: dict[str, Any] = {}

    def function(self, name: str) -> Any:
        """The entry point `name`."""
        if name not in self._functions:
            d = _driver()
            self._functions[name] = check(d.cuModuleGetFunction(self.handle, name.encode()),
                                          f"cuModuleGetFunction({name})")
        return self._functions[name]


_smem_opted_in: dict[int, int] = {}  # CUfunction -> dynamic smem bytes it may use


def allow_smem(function: Any, nbytes: int, what: str) -> None:
    """Opt a function in to `nbytes` of dynamic shared memory where that is above the 48 KiB default."""
    if nbytes <= max(DEFAULT_SMEM_LIMIT, _smem_opted_in.get(int(function), 0)):
        return
    d = _driver()
    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    check(d.cuFuncSetAttribute(function, attr, nbytes), f"cuFuncSetAttribute({what}, {nbytes} B dynamic smem)")
    _smem_opted_in[int(function)] = nbytes


PARAM_BYTES = {"ptr": 8, "size": 8, "tensormap": 128}


def param_sizes(function: Any, count: int = 4096) -> list[int] | None:
    """Byte sizes of a compiled kernel's first `count` parameters (cuFuncGetParamInfo, CUDA 12.4+);
    None where the driver cannot say. Asking past the last parameter is an API error that
    compute-sanitizer reports, so callers that know the count pass it."""
    d = _driver()
    sizes: list[int] = []
    while len(sizes) < count:
        try:
            err, _, size = d.cuFuncGetParamInfo(function, len(sizes))
        except Exception:  # bindings or driver without it
            return None
        if err == d.CUresult.CUDA_ERROR_INVALID_VALUE:
            return sizes  # past the last parameter
        if err != d.CUresult.CUDA_SUCCESS:
            return None
        sizes.append(int(size))
    return None


def param_count(function: Any) -> int | None:
    """How many parameters the compiled kernel takes (cuFuncGetParamCount), None where unknown."""
    d = _driver()
    try:
        err, count = d.cuFuncGetParamCount(function)
    except Exception:  # bindings or driver without it
        return None
    return int(count) if err == d.CUresult.CUDA_SUCCESS else None


def check_params(kernel: CudaKernel, function: Any) -> None:
    """The compiled signature must match the kernel's Params, or the launch would pass garbage."""
    expected = [PARAM_BYTES.get(p.kind, 0) for p in kernel.params]
    count = param_count(function) if function is not None else None
    if count is not None and count != len(expected):
        raise DriverError(f"kernel {kernel.name}: its compiled parameters are {count} values, but its Params "
                          f"({', '.join(p.name for p in kernel.params)}) are {len(expected)}")
    compiled = param_sizes(function, len(expected))
    if compiled and compiled != expected:  # an empty answer is indistinguishable from no answer
        raise DriverError(f"kernel {kernel.name}: its compiled parameters are {compiled} bytes, but its Params "
                          f"({', '.join(p.name for p in kernel.params)}) say {expected}")


def load_cubin(cubin: Any) -> Module:
    """Load a cubin (bytes, or a `Cubin`) into the current context."""
    return Module(bytes(getattr(cubin, "cubin", cubin)))


# ----------------------------------------------------------------------------- tensor maps

TMA_DTYPES = {"bf16": "BFLOAT16", "f16": "FLOAT16", "f32": "FLOAT32", "tf32": "FLOAT32", "f64": "FLOAT64",
              "i32": "INT32", "i64": "INT64", "i16": "UINT16", "i8": "UINT8"}
SWIZZLES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}


@dataclass(frozen=True)
class TensorMapArgs:
    """The arguments of cuTensorMapEncodeTiled for one operand, innermost dimension first."""

    dtype: str  # CU_TENSOR_MAP_DATA_TYPE_<dtype>
    address: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]  # bytes, dims 1.. (dim 0 is contiguous)
    box: tuple[int, ...]
    swizzle: str  # CU_TENSOR_MAP_SWIZZLE_<swizzle>


def tensormap_args(spec: TmaSpec, info: ArrayInfo, sizes: Mapping[str, int]) -> TensorMapArgs:
    """What to encode for `spec` over the argument `info` (row-major, checked before)."""
    rank = len(spec.dims)
    # the descriptor may span less than the array (a staged buffer's rows are padded)
    if len(info.shape) != rank or any(sizes[e] > n for e, n in zip(reversed(spec.dims), info.shape, strict=True)):
        raise DriverError(f"{spec.tensor}: the TMA descriptor spans {spec.dims}, "
                          f"but the array has shape {info.shape}")
    elt = ELEMENT_BYTES[spec.dtype]
    strides = tuple(info.strides[rank - 1 - i] * elt for i in range(1, rank))
    for i, s in enumerate(strides, start=1):
        if s % 16:
            raise ArgumentError(f"{spec.tensor}: TMA needs every row stride to be a multiple of 16 bytes; "
                                f"the stride along #{spec.dims[i]} is {s} B")
    if spec.swizzle not in SWIZZLES:
        raise DriverError(f"{spec.tensor}: swizzle {spec.swizzle} B is not one of {tuple(SWIZZLES)}")
    return TensorMapArgs(TMA_DTYPES[spec.dtype], info.ptr, tuple(sizes[e] for e in spec.dims), strides,
                         spec.box, SWIZZLES[spec.swizzle])


def encode_tensormap(args: TensorMapArgs) -> Any:
    """A CUtensorMap: element strides 1, no interleave, L2 promotion 128 B, out-of-bounds reads zero."""
    d = _driver()
    rank = len(args.dims)
    return check(d.cuTensorMapEncodeTiled(
        getattr(d.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{args.dtype}"), rank, args.address,
        [d.cuuint64_t(n) for n in args.dims], [d.cuuint64_t(s) for s in args.strides],
        [d.cuuint32_t(b) for b in args.box], [d.cuuint32_t(1)] * rank,
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(d.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{args.swizzle}"),
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,  # NONE fills zeros
    ), f"cuTensorMapEncodeTiled({args})")


_resident: dict[tuple[int, int], int] = {}  # (CUfunction, dynamic smem) -> blocks resident at once


def resident_blocks(kernel: CudaKernel, function: Any, smem: int, dev: Device) -> int:
    """How many blocks of the kernel the GPU runs at once, for a persistent grid: one per SM, or,
    for a cluster kernel, the blocks of the clusters that fit together (an SM left over in a GPC
    holds no cluster of 2; a grid sized by SMs alone would run its last clusters in a second wave).
    A persistent row kernel, or a contraction bounded for several blocks an SM (`blocks_per_sm`), fills
    every SM with as many blocks as fit at once."""
    plan_kernel = getattr(kernel.lowering, "kernel", None)
    several = bool(getattr(plan_kernel, "prefetch", False)) or getattr(plan_kernel, "blocks_per_sm", 1) > 1
    if kernel.cluster <= 1 and not several:
        return dev.sm_count
    key = (int(function), smem)
    if key not in _resident:
        d = _driver()
        allow_smem(function, smem, kernel.name)
        if kernel.cluster <= 1:
            what = f"no block of {kernel.threads} threads"
            fits = int(check(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(function, kernel.threads, smem),
                             f"cuOccupancyMaxActiveBlocksPerMultiprocessor({kernel.name})")) * dev.sm_count
        else:
            what = f"no cluster of {kernel.cluster} blocks"
            config = d.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = kernel.cluster * dev.sm_count, 1, 1
            config.blockDimX, config.blockDimY, config.blockDimZ = kernel.threads, 1, 1
            config.sharedMemBytes = smem
            config.numAttrs = 0
            fits = int(check(d.cuOccupancyMaxActiveClusters(function, config),
                             f"cuOccupancyMaxActiveClusters({kernel.name})")) * kernel.cluster
        if fits < 1:
            raise DriverError(f"kernel {kernel.name}: {what} with {smem} bytes of shared memory each fits on this GPU")
        _resident[key] = fits
    return _resident[key]


# ----------------------------------------------------------------------------- launching


class KernelArgs:
    """The `void*[]` cuLaunchKernel reads, and the storage its pointers point into."""

    def __init__(self, values: list[Any]):
        self.values = values  # ctypes scalars, or CUtensorMap objects (getPtr() is their address)
        addresses = [v.getPtr() if hasattr(v, "getPtr") else ctypes.addressof(v) for v in values]
        self.array = (ctypes.c_void_p * max(1, len(values)))(*addresses)

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def pack_args(kernel: CudaKernel, arrays: Mapping[str, ArrayInfo], sizes: Mapping[str, int]) -> KernelArgs:
    """One value per kernel parameter, in order: pointers, int64 sizes and encoded tensor maps."""
    values: list[Any] = []
    for p in kernel.params:
        if p.kind == "ptr":
            values.append(ctypes.c_uint64(arrays[p.tensor or ""].ptr))
        elif p.kind == "size":
            values.append(ctypes.c_int64(sizes[p.extent or ""]))
        elif p.kind == "tensormap" and p.tma is not None:
            values.append(encode_tensormap(tensormap_args(p.tma, arrays[p.tma.tensor], sizes)))
        else:
            raise DriverError(f"kernel {kernel.name}: parameter {p.name} has unknown kind {p.kind!r}")
    return KernelArgs(values)


def launch(kernel: CudaKernel, function: Any, arrays: Mapping[str, ArrayInfo], sizes: Mapping[str, int],
           grid: tuple[int, int, int], stream: int = 0, early: bool = False) -> bool:
    """Launch `function` (the kernel's entry point) on `stream` (0: the legacy default stream), with the
    kernel's dynamic shared memory for these sizes (opting in above 48 KiB). `early`: see
    `launch_function`. False when there was nothing to launch (an empty output)."""
    if min(grid) <= 0:
        return False
    smem = kernel.dynamic_smem(sizes)
    allow_smem(function, smem, kernel.name)
    launch_function(function, grid, kernel.threads, smem, stream, pack_args(kernel, arrays, sizes), kernel.name,
                    early)
    return True


def launch_function(function: Any, grid: tuple[int, int, int], threads: int, smem: int, stream: int,
                    args: KernelArgs, name: str, early: bool = False) -> None:
    """One launch. `early`: with programmatic stream serialization, so the kernel may start once every
    block of the previous kernel in the stream has let it (griddepcontrol.launch_dependents) and waits
    for that kernel itself (griddepcontrol.wait); only for kernels whose source does (sm_90+)."""
    d = _driver()
    if not early:
        result = d.cuLaunchKernel(function, *grid, threads, 1, 1, smem, d.CUstream(stream), args.address, 0)
        if result[0] != d.CUresult.CUDA_SUCCESS:
            check(result, f"cuLaunchKernel({name}, grid {grid}, {threads} threads, {smem} B smem)")
        return
    result = d.cuLaunchKernelEx(early_config(grid, threads, smem, stream), function, args.address, 0)
    if result[0] != d.CUresult.CUDA_SUCCESS:
        check(result, f"cuLaunchKernelEx({name}, grid {grid}, {threads} threads, {smem} B smem, early)")


_EARLY_CONFIGS: dict[tuple[tuple[int, int, int], int, int, int], Any] = {}
_EARLY_CONFIGS_KEPT = 256


def early_config(grid: tuple[int, int, int], threads: int, smem: int, stream: int) -> Any:
    """The launch configuration of an early launch (programmatic stream serialization allowed), made once
    per grid, block, shared memory and stream: building one costs several µs of Python a launch, and the
    driver only reads it during cuLaunchKernelEx."""
    key = (grid, threads, smem, stream)
    config = _EARLY_CONFIGS.get(key)
    if config is not None:
        return config
    d = _driver()
    config = d.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = smem
    config.hStream = d.CUstream(stream)
    attribute = d.CUlaunchAttribute()
    attribute.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attribute.value.programmaticStreamSerializationAllowed = 1
    config.attrs = [attribute]
    config.numAttrs = 1
    if len(_EARLY_CONFIGS) >= _EARLY_CONFIGS_KEPT:  # many streams or shapes: start over
        _EARLY_CONFIGS.clear()
    _EARLY_CONFIGS[key] = config
    return config


# True inside habu.bench.kernel_times.serial_launches: each kernel launches after the previous one completed, in
# the calls packed before the block too (a CallPlan reads `overlaps_launches` once, when it is built, and this
# flag at each launch)
serialised = False


def overlaps_launches(dev: Device) -> bool:
    """Programmatic dependent launch (griddepcontrol): where the device's target has it, outside `serialised`."""
    return not serialised and target_named(dev.arch).programmatic_launch


def memset_zero(ptr: int, nbytes: int, stream: int = 0) -> None:
    d = _driver()
    check(d.cuMemsetD8Async(d.CUdeviceptr(ptr), 0, nbytes, d.CUstream(stream)), "cuMemsetD8Async")


def copy_to_host(info: ArrayInfo, stream: int = 0) -> np.ndarray:
    """The array's contents as numpy (bf16 as its uint16 bits), after the stream's prior work."""
    d = _driver()
    out = np.empty(info.shape, dtype=NUMPY_STORAGE[info.dtype])
    if out.nbytes:
        check(d.cuMemcpyDtoHAsync(out.ctypes.data, d.CUdeviceptr(info.ptr), out.nbytes, d.CUstream(stream)),
              "cuMemcpyDtoHAsync")
        check(d.cuStreamSynchronize(d.CUstream(stream)), "cuStreamSynchronize")
    return out


def copy_from_host_async(ptr: int, values: np.ndarray, stream: int = 0) -> None:
    """Copy a contiguous host array to device memory in `stream`'s order. From pageable memory the
    call returns once the driver has staged the bytes, so `values` may be dropped afterwards."""
    if values.nbytes:
        d = _driver()
        check(d.cuMemcpyHtoDAsync(d.CUdeviceptr(ptr), values.ctypes.data, values.nbytes, d.CUstream(stream)),
              "cuMemcpyHtoDAsync")


# ----------------------------------------------------------------------------- device memory


def float_to_bf16_bits(values: Any) -> np.ndarray:
    """float32 values as bf16 bits, rounded to nearest with ties to even (NaN stays a quiet NaN)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    nan = np.isnan(np.asarray(values, dtype=np.float32))
    return np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded).astype(np.uint16)


def bf16_bits_to_float(bits: Any) -> np.ndarray:
    """bf16 bits (uint16) as float32 values (exact)."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def host_storage(values: Any, dtype: str) -> np.ndarray:
    """A host array in the device layout of `dtype`: bf16 as bits, never a float cast to uint16."""
    arr = np.asarray(values)
    if dtype == "bf16":
        if arr.dtype == np.uint16:
            return np.ascontiguousarray(arr)
        if arr.dtype.kind not in "fiub":
            raise ArgumentError(f"cannot store {arr.dtype} values as bf16")
        return float_to_bf16_bits(arr.astype(np.float32))
    return np.ascontiguousarray(arr, dtype=NUMPY_STORAGE[dtype])


class DeviceArray:
    """Device memory from cuMemAlloc, freed when dropped; readable by cupy/numba/torch through CAI."""

    def __init__(self, shape: tuple[int, ...], dtype: str, dev: Device):
        self.shape, self.dtype, self.device = tuple(shape), dtype, dev
        self.nbytes = ELEMENT_BYTES[dtype] * int(np.prod(shape, dtype=np.int64))
        d = _driver()
        with current(dev):
            self.ptr = int(check(d.cuMemAlloc(max(1, self.nbytes)), f"cuMemAlloc({self.nbytes} B)"))

    @property
    def info(self) -> ArrayInfo:
        return ArrayInfo(self.ptr, self.shape, row_major(self.shape), self.dtype, self.device.ordinal)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        typestr = "<V2" if self.dtype == "bf16" else np.dtype(NUMPY_STORAGE[self.dtype]).str
        return {"version": 3, "shape": self.shape, "typestr": typestr, "data": (self.ptr, False),
                "strides": None, "stream": None}

    def copy_from_host(self, values: Any) -> None:
        """Fill from a host array of the same size (synchronous). For bf16, floating-point values
        are rounded to bf16 (to nearest, ties to even); uint16 values are taken as bf16 bits."""
        src = host_storage(values, self.dtype)
        if src.nbytes != self.nbytes:
            raise ArgumentError(f"copy of {src.nbytes} B into a device array of {self.nbytes} B")
        d = _driver()
        with current(self.device):
            check(d.cuMemcpyHtoD(d.CUdeviceptr(self.ptr), src.ctypes.data, src.nbytes), "cuMemcpyHtoD")

    def to_host(self) -> np.ndarray:
        """A numpy copy, after all work on the legacy default stream."""
        with current(self.device):
            return copy_to_host(self.info)

    def __del__(self) -> None:
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if ptr:
            try:
                d = _driver()
                with current(self.device):
                    d.cuMemFree(d.CUdeviceptr(ptr))
            except Exception:
                pass  # interpreter shutdown: the driver frees everything with the context

    def __repr__(self) -> str:
        return f"DeviceArray({self.shape}, {self.dtype}, device {self.device.ordinal}, {self.ptr:#x})"


__all__ = [
    "Device",
    "DeviceArray",
    "DriverError",
    "KernelArgs",
    "Module",
    "TensorMapArgs",
    "allow_smem",
    "arch_for",
    "bf16_bits_to_float",
    "check",
    "check_params",
    "copy_to_host",
    "current",
    "device",
    "device_count",
    "encode_tensormap",
    "float_to_bf16_bits",
    "host_storage",
    "init",
    "launch",
    "load_cubin",
    "memset_zero",
    "pack_args",
    "param_sizes",
    "pointer_device",
    "tensormap_args",
]
