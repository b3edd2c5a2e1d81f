"""The map path: an elementwise kernel, one output element (or vector) per thread."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from habu.emit_cuda.emit_map import emit_map
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.rows import MapLowering
from habu.lower.support import MAP
from habu.paths.analytic import index_width, max_vector, multiples, node_of
from habu.paths.base import KernelPath
from habu.plan.patterns import Region
from habu.plan.plan import Kernel, MapKernel
from habu.spec.ir import Model
from habu.target import Target


class MapPath(KernelPath):
    support = MAP

    def default(self, model: Model, region: Region, target: Target, sizes: dict[str, int]) -> MapKernel:
        last = node_of(model, region.output)
        inner = last.lhs[-1].extent if last.lhs else None
        static = next((e.size for e in model.extents if e.name == inner), None) if inner else 1
        vec = max_vector(static, 4, multiples(model).get(inner, 1) if inner else 1) if last.lhs else 1
        return MapKernel(nodes=region.nodes, threads=256, vector=vec, index_width=index_width(model, sizes))

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
