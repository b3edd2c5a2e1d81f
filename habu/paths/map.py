"""The map path: an elementwise kernel, one output element (or vector) per thread."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from habu.emit_cuda.emit_map import emit_map
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.rows import MapLowering
from habu.lower.support import MAP
from habu.paths.base import KernelPath
from habu.plan.plan import Kernel, MapKernel
from habu.spec.ir import Model
from habu.target import Target


class MapPath(KernelPath):
    support = MAP

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        assert isinstance(base, MapKernel)
        for threads in (128, 256, 512, 1024):
            for vec in sorted({1, base.vector}):
                yield replace(base, threads=threads, vector=vec)

    def smem_bytes(self, lowering: MapLowering) -> int:  # type: ignore[override]
        return 0

    def registers(self, lowering: MapLowering) -> int:  # type: ignore[override]
        return 0

    def emit(self, name: str, model: Model, lowering: MapLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        return emit_map(name, model, lowering, static)


PATH = MapPath()
