"""A compiled model's call, checked once per argument layout and then only launched.

The first call with arguments of a layout (every tensor's shape, strides, dtype and device) runs every
check of `habu.emit_cuda.checks`, chooses the member, loads its kernels and packs their arguments into
a `CallPlan`; a later call with the same layout looks the plan up by that layout, checks only what
depends on the pointers (base-address alignment), fills the new pointers into the packed arguments
(re-encoding a tensor map only for a pointer it has not seen), allocates the outputs and intermediates
and launches. Nothing on this path copies from the device, synchronises, or reads device data: index
values are checked inside the kernels (`habu.emit_cuda.device_errors`), an int64 index tensor is
narrowed on the device in stream order by one launch (`habu.emit_cuda.narrow`; saturating, so a value
outside i32 stays out of range), and
with torch tensors every allocation comes from torch's caching allocator on the current stream — so
the call can be captured in a CUDA graph (`torch.cuda.graph`) once it has run eagerly with that layout.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from functools import partial
from threading import get_ident
from typing import Any

from habu.emit_cuda import driver
from habu.emit_cuda.arrays import ELEMENT_BYTES, TORCH_DTYPES, ArgumentError, ArrayInfo, row_major
from habu.emit_cuda.checks import Contract, converts_index
from habu.emit_cuda.kernel import CudaKernel
from habu.emit_cuda.narrow import NarrowLaunch, can_narrow
from habu.emit_cuda.raw_launch import arguments as raw_arguments
from habu.emit_cuda.raw_launch import raw_launcher
from habu.plan.lanes import LaneStep, lane_schedule, schedule_faults, uses_side_lane

_TORCH_NAMES = {habu: torch for torch, habu in TORCH_DTYPES.items()}
_INT_LIMITS = {"i16": (-(1 << 15), (1 << 15) - 1), "i32": (-(1 << 31), (1 << 31) - 1)}
_TENSORMAP_CACHE = 64  # encoded tensor maps kept per parameter (one per pointer seen)
_RAW_STREAMS_KEPT = 64  # streams whose ctypes launch arguments a launch keeps
_SIDE_STREAMS: dict[tuple[int, int], int] = {}  # (device, caller's stream) -> its side stream (`Plan.lanes` 2)
# byte the intermediates a call allocates are filled with before its launches, while `poisoned_intermediates` holds
# (the exact check: an element a kernel reads and no earlier kernel wrote is then a NaN, not a stale zero)
_POISON: ContextVar[int | None] = ContextVar("habu_poisoned_intermediates", default=None)


@contextmanager
def poisoned_intermediates(byte: int = 0xFF) -> Iterator[None]:
    """Within it (this thread or task only), every call fills the intermediates it allocates (staged buffers,
    stored stages; not the outputs, not the workspaces the plan zero-fills) with `byte` on its stream before the
    plan's launches."""
    token = _POISON.set(byte)
    try:
        yield
    finally:
        _POISON.reset(token)


def layout_key(tensors: Mapping[str, Any]) -> tuple | None:
    """What a call's checks depend on besides the pointers: each tensor's shape, strides, dtype and
    device (torch tensors and `ArrayInfo`s; None for other arrays, which take the checked path). The
    stream is not part of it: the packed launches go to whichever stream the call names."""
    torch = sys.modules.get("torch")
    parts: list[Any] = []
    for name, t in tensors.items():  # in the caller's order: another order is another (equal) entry
        if torch is not None and isinstance(t, torch.Tensor):
            parts.append((name, t.shape, t.stride(), t.dtype, t.get_device()))
        elif isinstance(t, ArrayInfo):
            parts.append((name, t.shape, t.strides, t.dtype, t.device, t.readonly))
        else:
            return None
    return tuple(parts)


def narrow_index(torch: Any, values: Any, dtype: str) -> Any:
    """An index tensor in the kernel's narrower integer type, on its device and stream: saturated, so a
    value outside the type stays outside every index range (the kernel's check reports it), never
    wrapped into range."""
    lo, hi = _INT_LIMITS[dtype]
    return values.clamp(lo, hi).to(getattr(torch, _TORCH_NAMES[dtype])).contiguous()


def pointer_of(t: Any) -> int:
    return t.ptr if isinstance(t, ArrayInfo) else int(t.data_ptr())


def current_stream(ordinal: int) -> int:
    """torch's current stream on a device (the raw handle, without building a Stream object)."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return int(raw(ordinal)) if raw is not None else int(torch.cuda.current_stream(ordinal).cuda_stream)


@dataclass
class _Slot:
    """A kernel parameter that changes with the call: a tensor's pointer, or a tensor map over it."""

    index: int  # the parameter's place in the kernel's argument array
    tensor: str
    tma: Any = None  # the TmaSpec of a tensor-map parameter
    info: ArrayInfo | None = None  # the tensor's checked layout (a tensor map is encoded from it)
    last: int = -1  # the pointer whose tensor map the packed arguments hold now


@dataclass
class _Launch:
    kernel: CudaKernel
    function: Any
    grid: tuple[int, int, int]
    smem: int
    args: driver.KernelArgs
    slots: list[_Slot]
    zeros: list[tuple[str, int]]  # (tensor, bytes) set to zero before the kernel runs
    maps: dict[tuple[int, int], Any]  # (slot index, pointer) -> encoded tensor map
    empty: bool = False  # nothing to launch (an empty output)
    head: tuple = ()  # cuLaunchKernel's arguments before the stream: (function, grid, block, shared memory)
    pointers: tuple[tuple[Any, str], ...] = ()  # (packed ctypes value, tensor) of each pointer parameter
    tensor_maps: tuple[_Slot, ...] = ()  # the tensor-map parameters
    waits: bool = False  # the kernel waits for the previous one (`CudaKernel.waits_for_previous`, read once)
    address: int = 0  # the packed arguments' `void*[]`
    raw: dict[int, tuple] = field(default_factory=dict)  # stream -> cuLaunchKernel's arguments (raw_launch)


@dataclass
class _Alloc:
    name: str
    shape: tuple[int, ...]
    dtype: str
    output: bool

    @property
    def strides(self) -> tuple[int, ...]:
        return row_major(self.shape)


class CallPlan:
    """The checked, packed launches of one member for one argument layout (see the module's text)."""

    def __init__(self, contract: Contract, sizes: Mapping[str, int], dev: driver.Device, torch_like: bool):
        self.contract, self.sizes, self.dev, self.torch_like = contract, dict(sizes), dev, torch_like
        self.launches: list[_Launch] = []
        self.allocs: list[_Alloc] = []
        # workspaces every launch leaves zero (`CudaKernel.zero_once`): allocated and zero-filled at a stream's
        # first call, then kept for that stream's later calls (which run in its order), not filled again
        self.kept_allocs: list[tuple[_Alloc, int]] = []
        self._kept: dict[int, list[Any]] = {}
        self.narrow: list[tuple[str, str]] = []  # (index tensor, the kernel's type): narrowed on the device by torch
        self.narrow_launches: list[NarrowLaunch] = []  # the same, by one launch of Habu's (habu.emit_cuda.narrow)
        self.aligned: list[tuple[str, int, str]] = []  # (tensor, bytes, why): base alignment, per call
        self.outputs = tuple(t.name for t in contract.tensors if t.role == "output")
        self.overlap = driver.overlaps_launches(dev)
        self._streams: dict[int, Any] = {}
        self._device: Any = None  # torch.device of `dev`, made once
        self._d = driver._driver()  # the cuda-python driver module (looked up once, not per launch)
        self._raw = raw_launcher(self._d)  # cuLaunchKernel keeping the GIL, or None (habu.emit_cuda.raw_launch)
        self._success = self._d.CUresult.CUDA_SUCCESS
        self._threads: set[int] = set()  # threads seen with the device's primary context current
        self._given: tuple[str, ...] = ()  # the outputs the caller passes (set by `build`)
        self._torch_allocs: list[tuple[str, tuple[int, ...], tuple[int, ...], Any, bool]] = []
        self._lean = False  # `run` takes `_run_lean` (set by `build`)
        self._torch_narrowed: list[tuple[NarrowLaunch, tuple[int, ...], tuple[int, ...], Any]] = []
        self._made_outputs: list[tuple[str, int]] = []  # (output, its place among a lean call's allocations)
        self._returns: int | None = None  # the one output's place there, when the call allocates it
        self.current_stream = partial(current_stream, dev.ordinal)  # torch's current stream on the device
        self._empty: Any = None  # torch.empty_strided
        self._get_device: Any = None  # torch's current device (torch._C._cuda_getDevice), with torch tensors
        # `Plan.lanes` 2: the launches' two-lane order (habu.plan.lanes), the events between the lanes (made at
        # the first call: the fork, the join, and one after each launch the other lane waits for)
        self.schedule: tuple[LaneStep, ...] | None = None
        self._events: dict[Any, Any] = {}
        self._waited: frozenset[int] = frozenset()  # the launches the other lane waits for (an event after each)

    # -- built once
    @classmethod
    def build(cls, contract: Contract, sizes: Mapping[str, int], dev: driver.Device, arrays: Mapping[str, ArrayInfo],
              kernels: list[tuple[CudaKernel, Any, tuple[int, int, int]]], torch_like: bool,
              all_torch: bool = False, lanes: int = 1) -> CallPlan:
        """`arrays`: the checked arguments; `kernels`: (kernel, loaded function, grid) in launch order;
        `all_torch`: every argument is a torch tensor (their pointers are read with `data_ptr`); `lanes`: the
        plan's (2: kernels that share no tensor run side by side, `lane_schedule`)."""
        plan = cls(contract, sizes, dev, torch_like)
        if lanes == 2:
            accesses = [(k.reading, k.writing) for k, _, _ in kernels]
            schedule = lane_schedule(accesses)
            faults = schedule_faults(accesses, schedule)
            if faults:  # never: the schedule keeps every conflicting pair's order (tests/plan/test_lanes.py)
                raise AssertionError(f"the two-lane schedule of {[k.name for k, _, _ in kernels]}: {faults[0]}")
            plan.schedule = schedule if uses_side_lane(schedule) else None
            plan._waited = frozenset(w for step in schedule for w in step.waits)
        plan._given = tuple(n for n in plan.outputs if n in arrays)
        infos = dict(arrays)
        for t in contract.tensors:
            info = arrays.get(t.name)
            if info is not None and converts_index(t, info):
                if not torch_like or t.dtype not in _INT_LIMITS:
                    raise NeedsHost(t.name)
                if can_narrow(info.dtype, t.dtype) and info.strides == row_major(info.shape):
                    count = 1
                    for extent in info.shape:
                        count *= extent
                    plan.narrow_launches.append(NarrowLaunch.make(dev, t.name, info.dtype, t.dtype, count))
                else:
                    plan.narrow.append((t.name, t.dtype))
                infos[t.name] = replace(info, dtype=t.dtype, strides=row_major(info.shape))
            elif info is not None and t.align > 1:
                plan.aligned.append((t.name, t.align, t.align_why))
            if info is None and (t.role == "output" or (t.role == "intermediate" and t.used)):
                shape = tuple(sizes[e] for e in t.extents)
                plan.allocs.append(_Alloc(t.name, shape, t.dtype, t.role == "output"))
                infos[t.name] = ArrayInfo(0, shape, row_major(shape), t.dtype, dev.ordinal)
        once = {z for kernel, _, _ in kernels for z in kernel.zero_once}
        plan.kept_allocs = [(a, infos[a.name].nbytes) for a in plan.allocs if a.name in once and not a.output]
        plan.allocs = [a for a in plan.allocs if a.name not in once or a.output]
        for kernel, fn, grid in kernels:
            smem = kernel.dynamic_smem(sizes)
            driver.allow_smem(fn, smem, kernel.name)
            stand_in = {n: replace(i, ptr=i.ptr or 1 << 20) for n, i in infos.items()}  # a tensor map needs an address
            args = driver.pack_args(kernel, stand_in, sizes)
            slots = [_Slot(i, p.tensor or "", p.tma, infos[p.tensor or ""]) for i, p in enumerate(kernel.params)
                     if p.kind in ("ptr", "tensormap")]
            zeros = [(z, infos[z].nbytes) for z in kernel.zero if z not in {a.name for a, _ in plan.kept_allocs}]
            maps = {(s.index, infos[s.tensor].ptr): args.values[s.index] for s in slots  # encoded by pack_args
                    if s.tma is not None and infos[s.tensor].ptr}
            head = (fn, *grid, kernel.threads, 1, 1, smem)
            pointers = tuple((args.values[s.index], s.tensor) for s in slots if s.tma is None)
            tensor_maps = tuple(s for s in slots if s.tma is not None)
            for s in tensor_maps:  # the map pack_args encoded is in the arguments now
                s.last = infos[s.tensor].ptr or -1
            plan.launches.append(_Launch(kernel, fn, grid, smem, args, slots, zeros, maps, min(grid) <= 0, head,
                                         pointers, tensor_maps, kernel.waits_for_previous, args.address))
        torch = sys.modules.get("torch") if torch_like else None
        if torch is not None:
            plan._torch_allocs = [(a.name, a.shape, a.strides, getattr(torch, _TORCH_NAMES[a.dtype]), a.output)
                                  for a in plan.allocs]
            plan._empty, plan._device = torch.empty_strided, plan._torch_device(torch)
            plan._get_device = getattr(torch._C, "_cuda_getDevice", torch.cuda.current_device)
            plan._torch_narrowed = [(nl, arrays[nl.tensor].shape, row_major(arrays[nl.tensor].shape),
                                     getattr(torch, _TORCH_NAMES[nl.kernel_type])) for nl in plan.narrow_launches]
        plan._lean = all_torch and torch is not None and not plan.narrow and not plan.kept_allocs
        plan._made_outputs = [(a[0], i) for i, a in enumerate(plan._torch_allocs) if a[4]]
        if len(plan.outputs) == 1 and len(plan._made_outputs) == 1:
            plan._returns = plan._made_outputs[0][1]
        if torch is not None and hasattr(torch._C, "_cuda_getCurrentRawStream"):
            plan.current_stream = partial(torch._C._cuda_getCurrentRawStream, dev.ordinal)
        return plan

    # -- every call
    def run(self, tensors: Mapping[str, Any], stream: int, torch_stream: Any = None) -> Any:
        """Launch on `stream`; `torch_stream`: the torch stream object the caller named, on which
        the outputs torch allocated here are recorded (its caching allocator must wait for it)."""
        if self._lean and torch_stream is None:
            return self._run_lean(tensors, stream)
        ptrs = {name: pointer_of(t) for name, t in tensors.items()}
        self._check_aligned(ptrs)
        keep: list[Any] = []  # what this call allocated, alive until its launches are queued
        results = {n: tensors[n] for n in self._given}
        narrowing: list[tuple[NarrowLaunch, int, int]] = []
        if self.narrow or self.narrow_launches or self.allocs:
            torch = sys.modules.get("torch") if self.torch_like else None
            for nl in self.narrow_launches:
                given = tensors[nl.tensor]
                narrowed = torch.empty_strided(given.shape, given.stride(),  # (row-major: `build` checked)
                                               dtype=getattr(torch, _TORCH_NAMES[nl.kernel_type]),
                                               device=self._torch_device(torch))
                if torch_stream is not None:
                    narrowed.record_stream(torch_stream)
                keep.append(narrowed)
                narrowing.append((nl, ptrs[nl.tensor], int(narrowed.data_ptr())))
                ptrs[nl.tensor] = narrowing[-1][2]
            for name, dtype in self.narrow:
                narrowed = narrow_index(torch, tensors[name], dtype)
                if torch_stream is not None:
                    narrowed.record_stream(torch_stream)
                keep.append(narrowed)
                ptrs[name] = int(narrowed.data_ptr())
            for a in self.allocs:
                arr = self._allocate(a, torch)
                keep.append(arr)
                ptrs[a.name] = pointer_of(arr) if torch is not None else arr.ptr
                if torch_stream is not None and torch is not None:
                    arr.record_stream(torch_stream)
                if a.output:
                    results[a.name] = arr
        fresh = self.kept_allocs and stream not in self._kept
        if self.kept_allocs:
            torch = sys.modules.get("torch") if self.torch_like else None
            kept = self._kept.setdefault(stream, [self._allocate(a, torch) for a, _ in self.kept_allocs])
            for (a, _), arr in zip(self.kept_allocs, kept, strict=True):
                ptrs[a.name] = pointer_of(arr) if torch is not None else arr.ptr
        self._queue(ptrs, stream, narrowing, bool(fresh))
        return results[self.outputs[0]] if len(self.outputs) == 1 else {n: results[n] for n in self.outputs}

    def _queue(self, ptrs: Mapping[str, int], stream: int, narrowing: list[tuple[NarrowLaunch, int, int]],
               fresh: bool = False) -> None:
        """Everything a call puts on `stream`, in the device's primary context (pushed for the launches where it
        is not current): the kept workspaces' zero fill where `fresh` (a stream's first call), the narrowing
        launches, then the plan's launches."""
        d = self._d
        handle = self._stream(stream)
        push = self.dev.context is not None and not self._context_is_current()
        if push:
            self._ok(d.cuCtxPushCurrent(self.dev.context), "cuCtxPushCurrent", None)
        try:
            if fresh:  # the stream's kept workspaces, zero-filled once before its first launches
                for a, nbytes in self.kept_allocs:
                    if nbytes:
                        self._ok(d.cuMemsetD8Async(d.CUdeviceptr(ptrs[a.name]), 0, nbytes, handle), "cuMemsetD8Async",
                                 None)
            poison = _POISON.get()
            if poison is not None:  # (before the launches, which zero-fill their own workspaces)
                for a in self.allocs:
                    nbytes = math.prod(a.shape) * ELEMENT_BYTES[a.dtype]
                    if nbytes and not a.output:
                        self._ok(d.cuMemsetD8Async(d.CUdeviceptr(ptrs[a.name]), poison, nbytes, handle),
                                 "cuMemsetD8Async", None)
            for nl, source, target in narrowing:
                self._ok(nl.launch(d, source, target, handle), f"cuLaunchKernel(narrowing {nl.tensor})", None)
            self._launch_all(d, ptrs, handle, stream)
        finally:
            if push:
                self._ok(d.cuCtxPopCurrent(), "cuCtxPopCurrent", None)

    def _check_aligned(self, ptrs: Mapping[str, int]) -> None:
        for name, align, why in self.aligned:
            if ptrs[name] % align:
                note = f" ({why})" if why else ""
                raise ArgumentError(f"{name}: base address {ptrs[name]:#x} is not {align}-byte aligned{note}")

    def _run_lean(self, tensors: Mapping[str, Any], stream: int) -> Any:
        """`run` for the usual call, the same steps in fewer Python operations (the host time of a call is
        most of a small kernel's): every argument a torch tensor, no index narrowed by torch's operations, no
        kept workspace, the outputs on torch's current stream."""
        ptrs = {name: t.data_ptr() for name, t in tensors.items()}
        if self.aligned:
            self._check_aligned(ptrs)
        made = []  # this call's outputs and intermediates (alive at least until its launches are queued)
        empty, device = self._empty, self._device
        for name, shape, strides, dtype, _ in self._torch_allocs:  # from torch's caching allocator
            arr = empty(shape, strides, dtype=dtype, device=device)
            ptrs[name] = arr.data_ptr()
            made.append(arr)
        narrowing = []
        for nl, shape, strides, dtype in self._torch_narrowed:  # int64 index tensors, narrowed by one launch each
            narrowed = empty(shape, strides, dtype=dtype, device=device)
            made.append(narrowed)
            narrowing.append((nl, ptrs[nl.tensor], narrowed.data_ptr()))
            ptrs[nl.tensor] = narrowing[-1][2]
        self._queue(ptrs, stream, narrowing)
        if self._returns is not None:  # one output, allocated here
            return made[self._returns]
        results = {n: tensors[n] for n in self._given}
        for name, i in self._made_outputs:
            results[name] = made[i]
        return results[self.outputs[0]] if len(self.outputs) == 1 else {n: results[n] for n in self.outputs}

    def _allocate(self, a: _Alloc, torch: Any) -> Any:
        if torch is not None:
            return torch.empty_strided(a.shape, a.strides, dtype=getattr(torch, _TORCH_NAMES[a.dtype]),
                                       device=self._torch_device(torch))
        return driver.DeviceArray(a.shape, a.dtype, self.dev)

    def _torch_device(self, torch: Any) -> Any:
        if self._device is None:
            self._device = torch.device("cuda", self.dev.ordinal)
        return self._device

    def _context_is_current(self) -> bool:
        """Whether this thread's current context is already the device's primary one, so the call needs
        no push and pop (two driver calls): with torch tensors, while torch's current device is this
        device and this thread was once seen with that context current (cuCtxGetCurrent, once a thread)."""
        if self._get_device is None or self._get_device() != self.dev.ordinal:  # (set by `build` with torch)
            return False
        thread = get_ident()
        if thread in self._threads:
            return True
        err, ctx = self._d.cuCtxGetCurrent()
        if err == self._success and ctx is not None and int(ctx) == int(self.dev.context):
            self._threads.add(thread)
            return True
        return False

    def _stream(self, stream: int) -> Any:
        handle = self._streams.get(stream)
        if handle is None:
            handle = self._streams[stream] = self._d.CUstream(stream)
        return handle

    def _launch_all(self, d: Any, ptrs: Mapping[str, int], handle: Any, stream: int) -> None:
        if self.schedule is not None:
            self._launch_lanes(d, ptrs, handle, stream)
            return
        after_kernel = False
        for ln in self.launches:
            after_kernel = self._launch_one(d, ln, ptrs, handle, stream, after_kernel)

    def _launch_one(self, d: Any, ln: _Launch, ptrs: Mapping[str, int], handle: Any, stream: int,
                    after_kernel: bool) -> bool:
        """One launch on `stream` (its zero fills first), early where it waits for the previous one and that was
        a kernel of this call (`after_kernel`); whether the stream's last operation is now a kernel."""
        for value, tensor in ln.pointers:  # this call's pointers into the packed arguments
            value.value = ptrs[tensor]
        if ln.tensor_maps:
            self._fill_maps(ln, ptrs)
        for tensor, nbytes in ln.zeros:
            if nbytes:
                self._ok(d.cuMemsetD8Async(d.CUdeviceptr(ptrs[tensor]), 0, nbytes, handle), "cuMemsetD8Async", ln)
            after_kernel = False
        if ln.empty:
            return after_kernel
        if after_kernel and ln.waits and self.overlap and not driver.serialised:
            driver.launch_function(ln.function, ln.grid, ln.kernel.threads, ln.smem, stream, ln.args,
                                   ln.kernel.name, True)
        elif self._raw is not None:
            args = ln.raw.get(stream)
            if args is None:
                if len(ln.raw) >= _RAW_STREAMS_KEPT:
                    ln.raw.clear()
                args = ln.raw[stream] = raw_arguments(ln.head, stream, ln.address)
            err = self._raw(*args)
            if err:
                _ok((d.CUresult(err),), "cuLaunchKernel", ln)
        else:
            result = d.cuLaunchKernel(*ln.head, handle, ln.address, 0)
            if result[0] != self._success:
                _ok(result, "cuLaunchKernel", ln)
        return True

    def _launch_lanes(self, d: Any, ptrs: Mapping[str, int], handle: Any, stream: int) -> None:
        """The launches by `schedule`: lane 1 on the side stream after what the caller queued before the call (the
        fork), a launch after the other lane's launches it waits for (their events), and the caller's stream after
        lane 1's last launch (the join). A launch that waits for an event, or follows one
        recorded on its lane, launches in order, not early."""
        assert self.schedule is not None
        side = self._side_stream(d, stream)
        side_handle = self._stream(side)
        lanes = ((handle, stream), (side_handle, side))
        after_kernel = [False, False]
        fork, join = self._event(d, "fork"), self._event(d, "join")
        self._ok(d.cuEventRecord(fork, handle), "cuEventRecord", None)
        self._ok(d.cuStreamWaitEvent(side_handle, fork, 0), "cuStreamWaitEvent", None)
        for step in self.schedule:
            h, s = lanes[step.lane]
            for w in step.waits:
                self._ok(d.cuStreamWaitEvent(h, self._event(d, w), 0), "cuStreamWaitEvent", None)
            ln = self.launches[step.launch]
            after_kernel[step.lane] = self._launch_one(d, ln, ptrs, h, s, after_kernel[step.lane] and not step.waits)
            if step.launch in self._waited:  # (the lane's next launch not early past the record: not tried on a GPU)
                self._ok(d.cuEventRecord(self._event(d, step.launch), h), "cuEventRecord", None)
                after_kernel[step.lane] = False
        self._ok(d.cuEventRecord(join, side_handle), "cuEventRecord", None)
        self._ok(d.cuStreamWaitEvent(handle, join, 0), "cuStreamWaitEvent", None)

    def _event(self, d: Any, key: Any) -> Any:
        """The call plan's event `key` (made once, without timing: it only orders the two lanes)."""
        event = self._events.get(key)
        if event is None:
            flags = d.CUevent_flags.CU_EVENT_DISABLE_TIMING
            event = self._events[key] = driver.check(d.cuEventCreate(flags), "cuEventCreate")
        return event

    def _side_stream(self, d: Any, stream: int) -> int:
        """The side stream of the caller's `stream` on this device (made once a pair, non-blocking, kept for the
        process: every call forks onto it and joins back, so calls that share it stay in their streams' order)."""
        key = (self.dev.ordinal, stream)
        side = _SIDE_STREAMS.get(key)
        if side is None:
            flags = d.CUstream_flags.CU_STREAM_NON_BLOCKING
            created = driver.check(d.cuStreamCreateWithPriority(flags, 0), "cuStreamCreateWithPriority")
            side = _SIDE_STREAMS[key] = int(created)
        return side

    def _ok(self, result: Any, what: str, ln: _Launch | None) -> None:
        err = result[0] if isinstance(result, tuple) else result
        if err != self._success:
            _ok(result, what, ln)

    def _fill_maps(self, ln: _Launch, ptrs: Mapping[str, int]) -> None:
        """This call's tensor maps into the packed arguments (cuLaunchKernel copies them at launch): one
        encoded per pointer seen, kept with the address of its bytes."""
        values, array = ln.args.values, ln.args.array
        for s in ln.tensor_maps:
            ptr = ptrs[s.tensor]
            if ptr == s.last:  # the arguments hold this pointer's map already
                continue
            kept = ln.maps.get((s.index, ptr))
            if kept is None:
                if len(ln.maps) >= _TENSORMAP_CACHE * len(ln.slots):
                    ln.maps.clear()
                assert s.info is not None
                kept = driver.encode_tensormap(driver.tensormap_args(s.tma, replace(s.info, ptr=ptr), self.sizes))
                ln.maps[(s.index, ptr)] = kept
            values[s.index] = kept
            array[s.index] = kept.getPtr()
            s.last = ptr


class NeedsHost(Exception):
    """This layout cannot be called without the host (an index tensor to narrow outside torch)."""


def _ok(result: Any, what: str, ln: _Launch | None) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != driver._driver().CUresult.CUDA_SUCCESS:
        where = f"({ln.kernel.name}, grid {ln.grid}, {ln.kernel.threads} threads, {ln.smem} B smem)" if ln else ""
        driver.check(result, what + where)


__all__ = ["CallPlan", "NeedsHost", "current_stream", "layout_key", "pointer_of", "poisoned_intermediates"]
