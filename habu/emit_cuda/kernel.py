"""What the emitter hands to the compiler and the runtime: a kernel's source and its launch contract.

A `CudaKernel` is one `extern "C" __global__` function. Its parameters, in order, are described by
`Param`s: device pointers to tensors, sizes of runtime extents, and TMA descriptors (passed by
value as `const __grid_constant__ CUtensorMap`). The grid comes from the lowering, so the runtime
launches exactly the blocks the finite-field check reasoned about.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from habu.emit_cuda.geometry import geometry_for


@dataclass(frozen=True)
class TmaSpec:
    """How the host encodes a tensor map (cuTensorMapEncodeTiled) for one operand."""

    tensor: str
    dtype: str
    dims: tuple[str, ...]  # extent names, innermost first
    box: tuple[int, ...]  # box size per dim, innermost first
    swizzle: int  # 0, 32, 64, 128 bytes

    @staticmethod
    def of(m: Any) -> TmaSpec:
        """The spec of a lowering's operand map (`habu.lower.tma_maps.OperandMap`)."""
        return TmaSpec(m.tensor, m.dtype, m.dims, m.box, m.swizzle)


@dataclass(frozen=True)
class Param:
    """One kernel parameter."""

    name: str
    kind: str  # "ptr", "size" (an extent's size, int64), "tensormap"
    tensor: str | None = None  # ptr / tensormap: the tensor
    dtype: str | None = None  # ptr: element type
    extent: str | None = None  # size: which extent
    writes: bool = False  # ptr: the kernel writes this tensor
    tma: TmaSpec | None = None


@dataclass(frozen=True)
class CudaKernel:
    """One kernel: its source, entry point, parameters and launch configuration."""

    name: str  # the extern "C" entry point
    source: str  # complete CUDA C++ (includes Habu's device header only)
    params: tuple[Param, ...]
    threads: int  # threads per block
    smem: int  # dynamic shared memory bytes
    lowering: Any = field(repr=False, compare=False)  # the lowering it was emitted from
    zero: tuple[str, ...] = ()  # outputs and workspaces the runtime zero-fills first (split-K adds into them)
    max_registers: int | None = None  # __launch_bounds__ cap, if any
    smem_per: tuple[str, int] | None = None  # extra dynamic smem: bytes × size of a runtime extent
    register_demand: int | None = None  # registers the setmaxnreg requests need from the CTA's pool
    cluster: int = 1  # blocks per thread-block cluster (the source's __cluster_dims__)
    # scratch buffers of the launch, (name, dtype, extent tokens): the runtime allocates them with the
    # plan's intermediates, for each call in the stream's order (two streams never share one), and
    # zero-fills them before the launch (they are in `zero`), e.g. a column kernel's per-tile counters
    workspace: tuple[tuple[str, str, tuple[str, ...]], ...] = ()
    # of `zero`, the workspaces every launch leaves zero again (split-KV's counters, reset by the block that
    # combines): a launch whose workspaces are kept from call to call zero-fills them once, when they are
    # allocated, and not before each launch (a memset and its gap: ~3 µs of a 11 µs decode on the H200)
    zero_once: tuple[str, ...] = ()
    # the tensors the kernel stores into, as its lowering says (`stored_accesses`: outputs a TMA store writes
    # have no pointer parameter that says so); with `writing` below, what a launch's order depends on
    stores: tuple[str, ...] = ()

    @cached_property
    def writing(self) -> frozenset[str]:
        """Every tensor a launch of this kernel writes: its stores, its written pointers, its zero fills and
        workspaces."""
        return frozenset((*self.stores, *(p.tensor for p in self.params if p.kind == "ptr" and p.writes and p.tensor),
                          *self.zero, *(w[0] for w in self.workspace)))

    @cached_property
    def reading(self) -> frozenset[str]:
        """The tensors a launch of this kernel reads and does not write (its pointers and tensor maps)."""
        return frozenset(p.tensor for p in self.params if p.kind in ("ptr", "tensormap") and p.tensor) - self.writing

    @cached_property
    def waits_for_previous(self) -> bool:
        """The source waits for the previous kernel of its stream (griddepcontrol.wait) before it
        touches what that kernel wrote: it may be launched before the previous one completes. (Read at
        every launch of a plan's later kernels: searched once in the source, then kept.)"""
        return "habu::grid_dependency_wait();" in self.source

    def check_registers(self, registers: int) -> None:
        """After ptxas: a warp-specialised kernel whose setmaxnreg requests exceed the registers it
        launches with would wait forever in setmaxnreg.inc. Refuse it rather than hang a GPU."""
        if self.register_demand is not None and registers and self.threads * registers < self.register_demand:
            raise ValueError(f"{self.name}: setmaxnreg asks {self.register_demand} registers but the CTA starts "
                             f"with {self.threads} threads × {registers} = {self.threads * registers}; "
                             "the kernel would hang")

    def dynamic_smem(self, sizes: Mapping[str, int]) -> int:
        """Dynamic shared memory for concrete sizes (a cached row grows with a runtime width)."""
        if self.smem_per is None:
            return self.smem
        extent, per = self.smem_per
        return self.smem + per * int(sizes[extent])

    def grid(self, sizes: Mapping[str, int], sm_count: int) -> tuple[int, int, int]:
        """Blocks to launch for concrete sizes: what the lowering says."""
        return geometry_for(self.lowering).blocks(self.lowering, sizes, sm_count)


@dataclass(frozen=True)
class EmittedPlan:
    """The kernels of a plan, in launch order, and the tensors between them."""

    kernels: tuple[CudaKernel, ...]
    intermediates: tuple[tuple[str, str, tuple[str, ...]], ...]  # (name, dtype, extents) allocated by the runtime
    lanes: int = 1  # streams the launches take (`Plan.lanes`; habu.emit_cuda.lanes): 2, independent kernels side by side
