"""The row path: one block (or a warp) per row, the row's reductions by warp shuffles and shared
memory, the row cached in shared memory or registers; clusters of blocks share a long row, and
persistent blocks prefetch their next row."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

from habu.emit_cuda.emit_rows import emit_rows
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.rows import RowLowering
from habu.lower.support import ROWS
from habu.paths.base import KernelPath
from habu.plan.plan import Kernel, RowKernel
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Model
from habu.target import Target


class RowsPath(KernelPath):
    support = ROWS

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        """Threads per row (a block, or a warp with several rows a block), the row cached or not; for
        a long static row (`row_length`) on a target with clusters, a cluster of blocks sharing each row."""
        assert isinstance(base, RowKernel)
        cols = row_length
        for threads, cache in itertools.product((64, 128, 256, 512, 1024), (True, False)):
            yield replace(base, threads=threads, cache_row=cache, rows_per_block=1, cluster=1, prefetch=False)
        for rows, cache in itertools.product((1, 2, 4, 8), (True, False)):  # a warp per row
            yield replace(base, threads=32, cache_row=cache, rows_per_block=rows, cluster=1, prefetch=False)
        if target.clusters and cols is not None and cols >= 16384:
            for share, threads in itertools.product((2, 4, 8), (256, 512, 1024)):
                if cols % (share * base.vector) == 0:
                    yield replace(base, threads=threads, cache_row=True, rows_per_block=1, cluster=share)
        # persistent blocks that copy their next row while they compute this one (in registers); not in
        # a cluster, where it lost everywhere (H200, 2026-12-01: softmax 2048x131072 433.7 -> 720.0 µs)
        if cols is not None and cols >= 8192:
            for threads in (256, 512, 1024):
                yield replace(base, threads=threads, cache_row=True, rows_per_block=1, cluster=1, prefetch=True)

    def smem_bytes(self, lowering: RowLowering, sizes: dict[str, int] | None = None) -> int:  # type: ignore[override]
        """The cached row's part of a block (0 when the row is not cached or its length unknown)."""
        k = lowering.kernel
        if not k.cache_row or sizes is None:
            return 0
        e = max((DTYPES[a.dtype].bytes for _, a in lowering.loads), default=4)
        return e * sizes[lowering.c] * k.rows_per_block // k.cluster

    def registers(self, lowering: RowLowering) -> int:  # type: ignore[override]
        return 0

    def emit(self, name: str, model: Model, lowering: RowLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        return emit_rows(name, model, lowering, static)


PATH = RowsPath()
