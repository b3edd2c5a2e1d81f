"""The general path: any equation node, one thread per output element, reductions as loops in f32 (the
fallback every model has; habu/lower/general.py lowers it, habu/emit_cuda/emit_general.py prints it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from habu.emit_cuda.emit_general import emit_general
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.general import GeneralLowering
from habu.lower.support import GENERAL
from habu.paths.analytic import index_width
from habu.paths.base import KernelPath
from habu.plan.patterns import Region
from habu.plan.plan import GeneralKernel, Kernel
from habu.spec.ir import Model
from habu.target import Target


class GeneralPath(KernelPath):
    support = GENERAL

    def default(self, model: Model, region: Region, target: Target, sizes: dict[str, int]) -> GeneralKernel:
        """256 threads, one output element each."""
        return GeneralKernel(nodes=region.nodes, threads=256, index_width=index_width(model, sizes))

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        assert isinstance(base, GeneralKernel)
        for threads in (64, 128, 256, 512, 1024):
            yield replace(base, threads=threads)

    def smem_bytes(self, lowering: GeneralLowering) -> int:  # type: ignore[override]
        return 0

    def registers(self, lowering: GeneralLowering) -> int:  # type: ignore[override]
        return 0

    def emit(self, name: str, model: Model, lowering: GeneralLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        return emit_general(name, model, lowering, static)


PATH = GeneralPath()
