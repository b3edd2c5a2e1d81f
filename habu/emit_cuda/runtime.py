"""A compiled model as a Python callable: check the arguments, choose a member, allocate, launch.

    model = CompiledModel(model, emitted)        # or a KernelSet of guarded EmittedPlans
    y = model(x=x, w=w)                          # torch / cupy / any DLPack or CAI arrays

Every precondition the proof assumed (shapes within the declared extents, dtypes, one CUDA
device, row-major layout, aligned base addresses) is checked before the first launch; a failure
raises ArgumentError and launches nothing. Index values are checked inside the kernels (their masks
include the index checks of the lowering): a value out of range is masked, never read through or
written through, and reported by `habu.check_errors()` (`device_errors`). Index tensors may come as
i16, i32 or i64 (torch's int64): one not of the kernel's type is narrowed on the way in. Kernels run
in order on the caller's stream (under `Plan.lanes` 2 the independent ones beside them on a side stream, forked
and joined by events: habu.plan.lanes); a call with torch tensors of a layout seen before only launches
(`call_plan`): no copy from the device, no synchronisation, capturable in a CUDA graph.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from habu.emit_cuda import device_errors, driver
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
from habu.emit_cuda.call_plan import CallPlan, NeedsHost, current_stream, layout_key
from habu.emit_cuda.checks import (
    Contract,
    TensorContract,
    check_arguments,
    check_index_range,
    contract_of,
    converts_index,
    index_values_for_kernel,
)
from habu.emit_cuda.driver import DeviceArray, DriverError, launch, load_cubin, memset_zero, resident_blocks
from habu.emit_cuda.guards import KernelSet
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan
from habu.emit_cuda.nvrtc import INCLUDE_DIR, Cubin
from habu.lower.access import with_derived
from habu.spec.ir import Model

_TORCH_NAMES = {habu: torch for torch, habu in TORCH_DTYPES.items()}  # Habu dtype -> torch attribute
_CALL_PLANS_KEPT = 1024  # argument layouts whose packed launches a CompiledModel keeps
_NOT_PLANNED = object()  # a layout not seen yet (None in `_calls`: a layout that needs the host every call)


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
    `check_indices`: "device" (the default; True and False mean it too) checks index values only in
    the kernels, reported by `habu.check_errors()`. "host" (for debugging) also copies every index
    tensor to the host before each launch and refuses a bad value with ArgumentError before anything
    runs, and raises what the device found since the last check first: a device-to-host copy and a
    synchronisation per index tensor per call, so such a call cannot be captured in a CUDA graph.
    An index tensor given in another integer type than the kernel reads (torch's int64 where the
    kernel loads i32) is accepted: torch tensors are narrowed on the device, saturating (a value
    outside i32 stays out of range for the kernel's check); other arrays' values are copied to the
    host, checked and uploaded narrowed (a synchronisation per call: pass the kernel's type).
    """

    def __init__(self, model: Model, plan: EmittedPlan | KernelSet[EmittedPlan], arch: str | None = None,
                 check_indices: bool | str = "device", include_dirs: tuple[str | Path, ...] = (INCLUDE_DIR,),
                 cache_dir: str | Path | None = None):
        self.model = model
        self.kernel_set: KernelSet[EmittedPlan] = (
            plan if isinstance(plan, KernelSet) else KernelSet([((), plan)]))
        self.contracts: list[Contract] = [contract_of(model, p) for _, p in self.kernel_set.members]
        if check_indices not in (True, False, "device", "host"):
            raise ArgumentError(f"check_indices: {check_indices!r} is not 'device' or 'host'")
        self.arch, self.check_indices = arch, "host" if check_indices == "host" else "device"
        self.include_dirs, self.cache_dir = include_dirs, cache_dir
        self._loaded: dict[tuple[int, int], list[Any]] = {}  # (member, device) -> entry points
        self._modules: list[driver.Module] = []
        # calls repeated with the same arrays (pointers, shapes, strides, dtypes) on the same stream
        # skip the checks that depend only on those and relaunch the packed arguments
        self._prepared: dict[tuple, _Prepared] = {}
        # calls with torch tensors (or ArrayInfos) of a layout checked before: packed once, then only launched
        self._calls: dict[tuple, CallPlan | None] = {}

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
                self._watch_errors(module, k, dev)
                fn = module.function(k.name)
                driver.check_params(k, fn)
                fns.append(fn)
            self._loaded[key] = fns
        return self._loaded[key]

    def _watch_errors(self, module: driver.Module, kernel: CudaKernel, dev: driver.Device) -> None:
        """Register the module's index error words (a kernel with index checks) for `check_errors`."""
        if "habu::index_ok(" not in kernel.source:
            return
        d = driver.init()
        found = d.cuModuleGetGlobal(module.handle, device_errors.SYMBOL)
        if found[0] != d.CUresult.CUDA_SUCCESS:
            return
        tables = tuple((t.name, t.range or "") for t in self.model.inputs if t.is_index)
        device_errors.register(device_errors.ErrorWords(self.model.name, kernel.name, tables, dev, int(found[1])))

    # -- checking (no launch happens before all of this has passed)
    def check(self, arrays: Mapping[str, ArrayInfo]) -> tuple[int, dict[str, int]]:
        """The member to run and the extents' sizes, or ArgumentError."""
        sizes = check_arguments(self.contracts[0].without_alignment(), arrays)
        member = self.kernel_set.index(sizes)
        return member, check_arguments(self.contracts[member], arrays)

    def _index_values(self, contract: Contract, arrays: Mapping[str, ArrayInfo], sizes: Mapping[str, int],
                      stream: int) -> dict[str, np.ndarray]:
        """Check the index tensors' values on the host (each one copied after the stream's prior work).
        Every index tensor is checked when `check_indices` is "host" (after raising what the device
        found since the last check); one given in another integer type than the kernel reads (an int64
        array the runtime does not narrow on the device) is checked always, since it is narrowed on the
        host: its values, in the kernel's type, are returned by name for the launch to upload."""
        converted: dict[str, np.ndarray] = {}
        if self.check_indices == "host":
            device_errors.check_errors(next((a.device for a in arrays.values() if a.device is not None), None))
        for t in contract.tensors:
            info = arrays.get(t.name)
            if t.index_range is None or info is None:
                continue
            convert = converts_index(t, info)
            if convert or self.check_indices == "host":
                values = driver.copy_to_host(info, stream)
                if convert:
                    converted[t.name] = index_values_for_kernel(t, values, sizes[t.index_range])
                else:
                    check_index_range(t.name, values, sizes[t.index_range], t.index_range)
        return converted

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
        if self.check_indices == "device":
            key = layout_key(tensors)
            if key is not None:
                call = self._calls.get(key, _NOT_PLANNED)
                if call is _NOT_PLANNED:
                    if len(self._calls) >= _CALL_PLANS_KEPT:  # many runtime shapes: start over
                        self._calls.clear()
                    call = self._calls[key] = self._plan_call(tensors)
                if call is not None:
                    if stream is None:
                        if call._lean:  # (the usual call of torch users: CallPlan.run's shortest path)
                            return call._run_lean(tensors, call.current_stream())
                        return call.run(tensors, current_stream(call.dev.ordinal) if call.torch_like else 0)
                    if not call.torch_like:
                        return call.run(tensors, stream_handle(stream, tensors, call.dev.ordinal))
                    if hasattr(stream, "cuda_stream"):  # a torch stream: torch's allocations are recorded on it
                        return call.run(tensors, int(stream.cuda_stream), stream)
                    # a raw handle beside torch tensors: the checked path allocates in that stream's order
        return self._call_checked(stream, tensors)

    def _member_for(self, arrays: dict[str, ArrayInfo], tensors: Mapping[str, Any]) -> tuple:
        """Every check of a call's arguments (`arrays`, their devices filled in place where the pointers
        say them): (member, its contract, its emitted plan, sizes with derived extents, device, whether
        the arguments are torch tensors)."""
        for name, info in arrays.items():
            if info.device is None and info.on_cuda and info.ptr:
                arrays[name] = replace(info, device=driver.pointer_device(info.ptr))
        member, sizes = self.check(arrays)
        contract, plan = self.contracts[member], self.kernel_set.members[member][1]
        sizes = with_derived(sizes, [e for t in contract.tensors for e in t.extents])  # "K^8": padded rows
        ordinal = next((a.device for a in arrays.values() if a.device is not None), 0)
        torch_like = any(is_torch_tensor(t) for t in tensors.values())
        return member, contract, plan, sizes, driver.device(ordinal), torch_like

    def _plan_call(self, tensors: Mapping[str, Any]) -> CallPlan | None:
        """Check a call's arguments and pack its launches for every later call of the same layout
        (None: this layout needs the host on every call, an int64 index tensor outside torch)."""
        arrays = {name: array_info(obj, name) for name, obj in tensors.items()}
        member, contract, plan, sizes, dev, torch_like = self._member_for(arrays, tensors)
        with driver.current(dev):
            functions = self._functions(member, dev)
            kernels = [(k, fn, k.grid(sizes, self._slots(k, fn, sizes, dev)))
                       for k, fn in zip(plan.kernels, functions, strict=True)]
            all_torch = all(is_torch_tensor(t) for t in tensors.values())
            try:
                return CallPlan.build(contract, sizes, dev, arrays, kernels, torch_like, all_torch, plan.lanes)
            except NeedsHost:
                return None

    def _call_checked(self, stream: Any, tensors: Mapping[str, Any]) -> Any:
        """A call checked from scratch (arrays other than torch tensors, or `check_indices="host"`)."""
        arrays = {name: obj.info if isinstance(obj, DeviceArray) else array_info(obj, name)
                  for name, obj in tensors.items()}
        key = self._key(arrays, stream, tensors)
        prepared = self._prepared.get(key) if key is not None else None
        if prepared is not None:
            return prepared.run(self, tensors)
        member, contract, plan, sizes, dev, torch_like = self._member_for(arrays, tensors)
        handle = stream_handle(stream, tensors, dev.ordinal)
        torch_stream = stream if torch_like and hasattr(stream, "cuda_stream") else None
        with driver.current(dev):
            functions = self._functions(member, dev)
            converted = self._index_values(contract, arrays, sizes, handle)
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
                for name, values in converted.items():
                    arrays[name] = prepared.keep_index(contract, name, values)
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
                for name, values in converted.items():
                    arrays[name] = scratch.upload(contract, name, values)
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
        self._calls.clear()

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
    Index-tensor values are re-checked every call when the model checks them (they may change); an
    index tensor given in another integer type is re-checked and re-converted into its kept copy."""

    def __init__(self, stream: int, contract: Contract, sizes: Mapping[str, int], arrays: Mapping[str, ArrayInfo],
                 dev: driver.Device):
        self.stream, self.contract, self.sizes, self.dev = stream, contract, dict(sizes), dev
        self.arrays = dict(arrays)
        self.given = dict(arrays)  # the arrays as the caller passed them (index tensors unconverted)
        self.launches: list[tuple[CudaKernel, Any, tuple[int, int, int], int, Any, list[tuple[int, int]]]] = []
        self.kept: list[DeviceArray] = []

    def keep(self, t: TensorContract, sizes: Mapping[str, int], dev: driver.Device) -> ArrayInfo:
        arr = DeviceArray(tuple(sizes[e] for e in t.extents), t.dtype, dev)
        self.kept.append(arr)
        self.arrays[t.name] = arr.info
        return arr.info

    def keep_index(self, contract: Contract, name: str, values: np.ndarray) -> ArrayInfo:
        """A kept device copy of a converted index tensor, filled with `values`."""
        t = contract.tensor(name)
        assert t is not None
        info = self.keep(t, self.sizes, self.dev)
        driver.copy_from_host_async(info.ptr, values, self.stream)
        return info

    def add(self, kernel: CudaKernel, fn: Any, arrays: Mapping[str, ArrayInfo], sizes: Mapping[str, int],
            grid: tuple[int, int, int]) -> None:
        smem = kernel.dynamic_smem(sizes)
        driver.allow_smem(fn, smem, kernel.name)
        zeros = [(arrays[z].ptr, arrays[z].nbytes) for z in kernel.zero if z not in kernel.zero_once]
        for z in kernel.zero_once:  # kept from call to call, left zero by each launch: zero-filled once
            memset_zero(arrays[z].ptr, arrays[z].nbytes, self.stream)
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
            for name, values in model._index_values(self.contract, self.given, self.sizes, self.stream).items():
                driver.copy_from_host_async(self.arrays[name].ptr, values, self.stream)
            self.launch_all()
        return self.results(tensors)


class _Scratch:
    """Intermediates: stream-ordered allocations (cuMemAllocAsync), freed in stream order after the launches."""

    def __init__(self, stream: int):
        self.stream, self.ptrs = stream, []

    def alloc(self, t: TensorContract, sizes: Mapping[str, int], nbytes: int,
              shape: tuple[int, ...] | None = None) -> ArrayInfo:
        d = driver.init()
        ptr = int(driver.check(d.cuMemAllocAsync(max(1, nbytes), d.CUstream(self.stream)),
                               f"cuMemAllocAsync({nbytes} B for {t.name})"))
        self.ptrs.append(ptr)
        shape = tuple(sizes[e] for e in t.extents) if shape is None else shape
        return ArrayInfo(ptr, shape, row_major(shape), t.dtype, None)

    def upload(self, contract: Contract, name: str, values: np.ndarray) -> ArrayInfo:
        """A converted index tensor's values in a stream-ordered allocation."""
        t = contract.tensor(name)
        assert t is not None
        info = self.alloc(t, {}, values.nbytes, tuple(values.shape))
        driver.copy_from_host_async(info.ptr, values, self.stream)
        return info

    def free(self) -> None:
        if not self.ptrs:
            return
        d = driver.init()
        for ptr in self.ptrs:
            driver.check(d.cuMemFreeAsync(d.CUdeviceptr(ptr), d.CUstream(self.stream)), "cuMemFreeAsync")
        self.ptrs = []


__all__ = ["ArgumentError", "ArrayInfo", "CompiledModel", "DeviceArray", "KernelSet", "array_info",
           "check_arguments", "check_index_range", "contract_of", "launch", "load_cubin", "stream_handle"]
