"""The interface every kernel path implements (see docs/ARCHITECTURE.md, "Adding a kernel path").

A kernel path is one way Habu builds a kernel of a plan: the SIMT, mma.sync and wgmma contractions
(told apart by the plan kernel's `mma` field), the row kernels and the elementwise maps. Each is
one module of habu/paths/ defining one `KernelPath`; `habu/paths/__init__.py` lists them. The path
says which plan kernels it takes, what of them its emitter can print (through its `support`, the
pure predicates in habu/lower/support.py that the rules read), its analytic default (asked by
`preference`), which variants the search tries, what shared memory and registers it needs, the
cost model's terms for it, and it prints the CUDA.

Layering: this package sits above habu/emit_cuda and habu/prove (a path prints through its emitter
and states its obligations) and below habu/search (the search space and the cost model ask it).
What the rules need of a path lives one layer further down, in its `support`, so the rules never
import this package.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator

from habu.emit_cuda.kernel import CudaKernel
from habu.lower import Lowering
from habu.lower.support import PathSupport
from habu.plan.patterns import Region
from habu.plan.plan import Kernel
from habu.prove.obligation import Context, Obligation
from habu.prove.rules import supported
from habu.spec.ir import Model
from habu.target import Target


class KernelPath(ABC):
    """One kernel path. Subclasses set `support` (its `name` is the path's name) and implement
    `default`, `variants`, `smem_bytes`, `registers` and `emit`."""

    support: PathSupport
    # the order in which the analytic default asks the paths of a family (higher first; equal ones in
    # the registry's order): the first whose `default` gives a kernel builds the region
    preference: int = 0

    @property
    def name(self) -> str:
        return self.support.name

    @property
    def family(self) -> str:
        """The rule family and cost family: "contraction", "rows" or "map"."""
        return self.support.family

    def accepts(self, kernel: Kernel) -> bool:
        """Whether this path builds `kernel` (the registry takes the first path that does)."""
        return self.support.accepts(kernel)

    def supported(self, name: str, lowering: Lowering, ctx: Context) -> Iterator[Obligation]:
        """The `supported-path` obligation: what the emitter can print, as `support.refusals` says
        (the rules ask the same object; nothing else restates it)."""
        return supported(name, lowering, ctx)

    @abstractmethod
    def default(self, model: Model, region: Region, target: Target, sizes: dict[str, int]) -> Kernel | None:
        """The analytic default for `region` (a region of this path's family) at `sizes` on `target`,
        or None when this path does not build it there (the registry then asks the next path)."""

    @abstractmethod
    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        """The search space: every candidate kernel of this path for a region whose analytic default
        is `base`, in canonical order. `row_length`: a row kernel's static row length (None if runtime)."""

    def region_variants(self, model: Model, region: Region, base: Kernel, target: Target,
                        sizes: dict[str, int]) -> Iterator[Kernel]:
        """The search space of `region` whose default (this path's) is `base` (`variants`, with what
        the path reads of the region and of its `sizes`)."""
        return self.variants(base, target)

    @abstractmethod
    def smem_bytes(self, lowering: Lowering) -> int:
        """Shared memory a block requests (dynamic and static), as the emitter lays it out."""

    @abstractmethod
    def registers(self, lowering: Lowering) -> int:
        """About how many registers a thread needs (0: the path does not estimate them)."""

    @abstractmethod
    def emit(self, name: str, model: Model, lowering: Lowering, static: dict[str, int], target: Target,
             early_main_loop: bool = False) -> CudaKernel:
        """The CUDA of one lowered kernel. `early_main_loop`: no earlier kernel of the plan writes
        what the main loop reads (a contraction may then start before the previous kernel ends)."""
