"""A compiled model as a Python callable: check the arguments, choose a member, allocate, launch.

    model = CompiledModel(model, emitted)        # or a KernelSet of guarded EmittedPlans
    y = model(x=x, w=w)                          # torch / cupy / any DLPack or CAI arrays

Every precondition the proof assumed (shapes within the declared extents, dtypes, one CUDA
device, row-major layout, aligned base addresses, index values in range) is checked before the
first launch; a failure raises ArgumentError and launches nothing. Kernels run in order on the
caller's stream.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from habu.emit_cuda import driver
from habu.emit_cuda.arrays import (
    ELEMENT_BYTES,
    TORCH_DTYPES,
    ArgumentError,
    ArrayInfo,
    array_info,
    is_torch_tensor,
    row_major,
)
from habu.emit_cuda.cache import compile_cached
from habu.emit_cuda.checks import Contract, TensorContract, check_arguments, check_index_range, contract_of
from habu.emit_cuda.driver import DeviceArray, DriverError, launch, load_cubin, memset_zero, resident_blocks
from habu.emit_cuda.guards import KernelSet
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan
from habu.emit_cuda.nvrtc import INCLUDE_DIR, Cubin
from habu.lower.access import with_derived
from habu.spec.ir import Model

_TORCH_NAMES = {habu: torch for torch, habu in TORCH_DTYPES.items()}  # Habu dtype -> torch attribute


def stream_handle(stream: Any, tensors: Mapping[str, Any], ordinal: int) -> int:
    """The CUstream to launch on: an int, a torch/cupy/cuda.core stream, or None (torch's current
    stream when the arrays are torch tensors, else the legacy default stream)."""
    if stream is None:
        if any(is_torch_tensor(t) for t in tensors.values()):
            return int(sys.modules["torch"].cuda.current_stream(ordinal).cuda_stream)
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):  # the CUDA stream protocol: (version, handle)
        return int(stream.__cuda_stream__()[1])
    for attr in ("cuda_stream", "ptr", "handle"):  # torch, cupy, cuda.core
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    try:
        return int(stream)  # cuda.bindings CUstream
    except (TypeError, ValueError):
        raise ArgumentError(f"stream: cannot use a {type(stream).__name__} as a CUDA stream") from None


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class CompiledModel:
    """A model's emitted kernels, callable with GPU arrays.

    `model` is the model the plan was emitted for (its extents and tensor declarations are the
    contract); `arch` is the target the plan was made for (None: the device's own).
    `check_indices` copies every index tensor to the host before the launch to check its values
    are in range: one device-to-host copy and a stream synchronisation per index tensor per call.
    """

    def __init__(self, model: Model, plan: EmittedPlan | KernelSet[EmittedPlan], arch: str | None = None,
                 check_indices: bool = True, include_dirs: tuple[str | Path, ...] = (INCLUDE_DIR,),
                 cache_dir: str | Path | None = None):
        self.model = model
        self.kernel_set: KernelSet[EmittedPlan] = (
            plan if isinstance(plan, KernelSet) else KernelSet([((), plan)]))
        self.contracts: list[Contract] = [contract_of(model, p) for _, p in self.kernel_set.members]
        self.arch, self.check_indices = arch, check_indices
        self.include_dirs, self.cache_dir = include_dirs, cache_dir
        self._loaded: dict[tuple[int, int], list[Any]] = {}  # (member, device) -> entry points
        self._modules: list[driver.Module] = []
        # calls repeated with the same arrays (pointers, shapes, strides, dtypes) on the same stream
        # skip the checks that depend only on those and relaunch the packed arguments
        self._prepared: dict[tuple, _Prepared] = {}

    # -- compiling
    def compile(self, arch: str) -> list[list[Cubin]]:
        """Compile every member's kernels for `arch` (through the cache); needs no GPU."""
        return [[self._cubin(k, arch) for k in plan.kernels] for _, plan in self.kernel_set.members]

    def _cubin(self, kernel: CudaKernel, arch: str) -> Cubin:
        cubin = compile_cached(kernel.source, kernel.name, arch, self.include_dirs, (), self.cache_dir)[0]
        kernel.check_registers(cubin.resources.registers)
        return cubin

    def _functions(self, member: int, dev: driver.Device) -> list[Any]:
        key = (member, dev.ordinal)
        if key not in self._loaded:
            arch = self.arch or dev.arch
            if arch != dev.arch:
                raise DriverError(f"the plan was made for {arch}, "
                                  f"but device {dev.ordinal} runs {dev.arch} code")
            fns = []
            for k in self.kernel_set.members[member][1].kernels:
                module = load_cubin(self._cubin(k, arch))
                self._modules.append(module)
                fn = module.function(k.name)
                driver.check_params(k, fn)
                fns.append(fn)
            self._loaded[key] = fns
        return self._loaded[key]

    # -- checking (no launch happens before all of this has passed)
    def check(self, arrays: Mapping[str, ArrayInfo]) -> tuple[int, dict[str, int]]:
        """The member to run and the extents' sizes, or ArgumentError."""
        sizes = check_arguments(self.contracts[0].without_alignment(), arrays)
        member = self.kernel_set.index(sizes)
        return member, check_arguments(self.contracts[member], arrays)

    def _check_index_values(self, contract: Contract, arrays: Mapping[str, ArrayInfo], sizes: Mapping[str, int],
                            stream: int) -> None:
        for t in contract.tensors:
            if t.index_range is not None and t.name in arrays:
                values = driver.copy_to_host(arrays[t.name], stream)
                check_index_range(t.name, values, sizes[t.index_range], t.index_range)

    # -- allocating
    def _allocate(self, t: TensorContract, sizes: Mapping[str, int], dev: driver.Device, torch_like: bool,
                  torch_stream: Any) -> tuple[Any, ArrayInfo]:
        shape = tuple(sizes[e] for e in t.extents)
        if torch_like:
            torch = sys.modules["torch"]
            out = torch.empty(shape, dtype=getattr(torch, _TORCH_NAMES[t.dtype]), device=f"cuda:{dev.ordinal}")
            if torch_stream is not None:
                out.record_stream(torch_stream)  # the caching allocator must wait for our stream
            return out, array_info(out, t.name)
        arr = DeviceArray(shape, t.dtype, dev)
        return arr, arr.info

    # -- calling
    def __call__(self, stream: Any = None, **tensors: Any) -> Any:
        """Run the model; returns the output array, or a dict of them when the model has several."""
        arrays = {name: obj.info if isinstance(obj, DeviceArray) else array_info(obj, name)
                  for name, obj in tensors.items()}
        key = self._key(arrays, stream, tensors)
        prepared = self._prepared.get(key) if key is not None else None
        if prepared is not None:
            return prepared.run(self, tensors)
        for name, info in arrays.items():
            if info.device is None and info.on_cuda and info.ptr:
                arrays[name] = replace(info, device=driver.pointer_device(info.ptr))
        member, sizes = self.check(arrays)
        contract, plan = self.contracts[member], self.kernel_set.members[member][1]
        sizes = with_derived(sizes, [e for t in contract.tensors for e in t.extents])  # "K^8": padded rows
        ordinal = next((a.device for a in arrays.values() if a.device is not None), 0)
        dev = driver.device(ordinal)
        torch_like = any(is_torch_tensor(t) for t in tensors.values())
        handle = stream_handle(stream, tensors, ordinal)
        torch_stream = stream if torch_like and hasattr(stream, "cuda_stream") else None
        with driver.current(dev):
            functions = self._functions(member, dev)
            if self.check_indices:
                self._check_index_values(contract, arrays, sizes, handle)
            results: dict[str, Any] = {}
            for t in contract.tensors:
                if t.role == "output" and t.name not in arrays:
                    results[t.name], arrays[t.name] = self._allocate(t, sizes, dev, torch_like, torch_stream)
                elif t.role == "output":
                    results[t.name] = tensors[t.name]
            outputs_given = all(t.name in tensors for t in contract.tensors if t.role == "output")
            if key is not None and outputs_given:
                # keep the intermediates allocated with the prepared launch (reused by later calls)
                prepared = _Prepared(handle, contract, sizes, arrays, dev)
                for t in contract.tensors:
                    if t.role == "intermediate" and t.used:
                        arrays[t.name] = prepared.keep(t, sizes, dev)
                for kernel, fn in zip(plan.kernels, functions, strict=True):
                    prepared.add(kernel, fn, arrays, sizes, kernel.grid(sizes, self._slots(kernel, fn, sizes, dev)))
                self._prepared[key] = prepared
                prepared.launch_all()
                return prepared.results(tensors)
            scratch = _Scratch(handle)
            try:
                for t in contract.tensors:
                    if t.role == "intermediate" and t.used:
                        nbytes = ELEMENT_BYTES[t.dtype] * _numel(tuple(sizes[e] for e in t.extents))
                        arrays[t.name] = scratch.alloc(t, sizes, nbytes)
                after_kernel = False  # the stream's last operation was this plan's previous kernel
                for kernel, fn in zip(plan.kernels, functions, strict=True):
                    for z in kernel.zero:
                        memset_zero(arrays[z].ptr, arrays[z].nbytes, handle)
                        after_kernel = False
                    early = after_kernel and kernel.waits_for_previous and driver.overlaps_launches(dev)
                    grid = kernel.grid(sizes, self._slots(kernel, fn, sizes, dev))
                    after_kernel = launch(kernel, fn, arrays, sizes, grid, handle, early) or after_kernel
            finally:
                scratch.free()
        outputs = [t.name for t in contract.tensors if t.role == "output"]
        return results[outputs[0]] if len(outputs) == 1 else {n: results[n] for n in outputs}

    def release_prepared(self) -> None:
        """Forget the launches packed for earlier calls' arrays (and the intermediates kept with them)."""
        self._prepared.clear()

    @staticmethod
    def _slots(kernel: CudaKernel, function: Any, sizes: Mapping[str, int], dev: Any) -> int:
        """Blocks resident at once: what a persistent kernel's grid is sized by."""
        return resident_blocks(kernel, function, kernel.dynamic_smem(sizes), dev)

    def _key(self, arrays: Mapping[str, ArrayInfo], stream: Any, tensors: Mapping[str, Any]) -> tuple | None:
        try:
            handle = stream_handle(stream, tensors, next((a.device for a in arrays.values()
                                                          if a.device is not None), 0))
        except ArgumentError:
            return None
        return (handle, tuple(sorted((n, a.ptr, a.shape, a.strides, a.dtype, a.device)
                                     for n, a in arrays.items())))


class _Prepared:
    """Launches whose arguments were checked and packed once: later identical calls only launch.
    Index-tensor values are re-checked every call when the model checks them (they may change)."""

    def __init__(self, stream: int, contract: Contract, sizes: Mapping[str, int], arrays: Mapping[str, ArrayInfo],
                 dev: driver.Device):
        self.stream, self.contract, self.sizes, self.dev = stream, contract, dict(sizes), dev
        self.arrays = dict(arrays)
        self.launches: list[tuple[CudaKernel, Any, tuple[int, int, int], int, Any, list[tuple[int, int]]]] = []
        self.kept: list[DeviceArray] = []

    def keep(self, t: TensorContract, sizes: Mapping[str, int], dev: driver.Device) -> ArrayInfo:
        arr = DeviceArray(tuple(sizes[e] for e in t.extents), t.dtype, dev)
        self.kept.append(arr)
        self.arrays[t.name] = arr.info
        return arr.info

    def add(self, kernel: CudaKernel, fn: Any, arrays: Mapping[str, ArrayInfo], sizes: Mapping[str, int],
            grid: tuple[int, int, int]) -> None:
        smem = kernel.dynamic_smem(sizes)
        driver.allow_smem(fn, smem, kernel.name)
        zeros = [(arrays[z].ptr, arrays[z].nbytes) for z in kernel.zero]
        self.launches.append((kernel, fn, grid, smem, driver.pack_args(kernel, arrays, sizes), zeros))

    def launch_all(self) -> None:
        """The plan's kernels in order; each one after the first launched early where its source waits
        for the previous one (and no memset came between)."""
        overlap = driver.overlaps_launches(self.dev)
        after_kernel = False
        for kernel, fn, grid, smem, args, zeros in self.launches:
            for ptr, nbytes in zeros:
                memset_zero(ptr, nbytes, self.stream)
                after_kernel = False
            if min(grid) <= 0:
                continue
            early = after_kernel and kernel.waits_for_previous and overlap
            driver.launch_function(fn, grid, kernel.threads, smem, self.stream, args, kernel.name, early)
            after_kernel = True

    def results(self, tensors: Mapping[str, Any]) -> Any:
        outputs = [t.name for t in self.contract.tensors if t.role == "output"]
        return tensors[outputs[0]] if len(outputs) == 1 else {n: tensors[n] for n in outputs}

    def run(self, model: CompiledModel, tensors: Mapping[str, Any]) -> Any:
        with driver.current(self.dev):
            if model.check_indices:
                model._check_index_values(self.contract, self.arrays, self.sizes, self.stream)
            self.launch_all()
        return self.results(tensors)


class _Scratch:
    """Intermediates: stream-ordered allocations (cuMemAllocAsync), freed in stream order after the launches."""

    def __init__(self, stream: int):
        self.stream, self.ptrs = stream, []

    def alloc(self, t: TensorContract, sizes: Mapping[str, int], nbytes: int) -> ArrayInfo:
        d = driver.init()
        ptr = int(driver.check(d.cuMemAllocAsync(max(1, nbytes), d.CUstream(self.stream)),
                               f"cuMemAllocAsync({nbytes} B for {t.name})"))
        self.ptrs.append(ptr)
        shape = tuple(sizes[e] for e in t.extents)
        return ArrayInfo(ptr, shape, row_major(shape), t.dtype, None)

    def free(self) -> None:
        if not self.ptrs:
            return
        d = driver.init()
        for ptr in self.ptrs:
            driver.check(d.cuMemFreeAsync(d.CUdeviceptr(ptr), d.CUstream(self.stream)), "cuMemFreeAsync")
        self.ptrs = []


__all__ = ["ArgumentError", "ArrayInfo", "CompiledModel", "DeviceArray", "KernelSet", "array_info",
           "check_arguments", "check_index_range", "contract_of", "launch", "load_cubin", "stream_handle"]
