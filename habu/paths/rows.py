"""The row path: one block (or a warp) per row, the row's reductions by warp shuffles and shared
memory, the row cached in shared memory or registers; clusters of blocks share a long row, and
persistent blocks prefetch their next row."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace

from habu.emit_cuda.emit_rows import emit_rows
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.rows import RowLowering, column_functions, lower_rows, registers_per_thread, row_registers
from habu.lower.support import ROWS
from habu.paths.analytic import index_width, max_vector, multiples, node_of
from habu.paths.base import KernelPath
from habu.plan.patterns import Region, row_local
from habu.plan.plan import Kernel, RowKernel
from habu.plan.storage import dtype_bytes
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Extent, Model
from habu.target import Target

# a row of at most this many bytes is cached in one block's shared memory by default
ROW_CACHE_BYTES = 200 * 1024


def row_extent(model: Model, region: Region) -> Extent:
    """The extent a row region's rows run along (its columns)."""
    last = node_of(model, region.output)
    axes = row_local(last)
    c_ext = axes[1] if axes else last.lhs[-1].extent
    return next(e for e in model.extents if e.name == c_ext)


class RowsPath(KernelPath):
    support = ROWS

    def default(self, model: Model, region: Region, target: Target, sizes: dict[str, int]) -> RowKernel:
        extent = row_extent(model, region)
        c_ext, static = extent.name, extent.size
        # the widest element read along the row; where no input runs along it (a broadcast, dX[b i] = dO[b]:
        # the backward of a row sum), the widest written along it
        eb = max((dtype_bytes(model, t.name) for t in model.inputs if c_ext in t.extents),
                 default=max((dtype_bytes(model, t.name) for t in model.outputs if c_ext in t.extents), default=4))
        vec = max_vector(static, eb, multiples(model).get(c_ext, 1))
        cols = sizes[c_ext]
        width = index_width(model, sizes)

        def kernel(threads: int, rows: int = 1, cache: bool = True, share: int = 1, prefetch: bool = False,
                   blocks: int = 1) -> RowKernel:
            return RowKernel(nodes=region.nodes, rows_per_block=rows, threads=threads, vector=vec, cache_row=cache,
                             index_width=width, cluster=share, prefetch=prefetch, blocks_per_sm=blocks)

        def in_registers(threads: int) -> bool:
            return lower_rows(model, kernel(threads)).register_chunks(sizes) > 0

        threads = 32  # enough threads that each holds about four 16-byte chunks of the row
        while threads < 1024 and threads * vec * 4 < cols:
            threads *= 2
        # fewer threads, if that keeps the row in registers (H200, 2026-12-01: RMSNorm 8192x65536 535 µs
        # with 512 threads in registers, 598 with 1024 through shared memory)
        fewer = threads
        while fewer > 32 and not in_registers(fewer):
            fewer //= 2
        if in_registers(fewer) and not in_registers(threads):
            threads = fewer
        # short rows: a warp per row, four rows per block, no block-wide barriers (softmax at 4096 columns
        # took 59.5 µs this way, 37.6 with 128 threads per row: only rows of at most 32 chunks)
        rows = 4 if threads == 32 else 1
        # a runtime width is cached when its widest row (the extent's `hi`) fits
        cache = max(cols, extent.hi if static is None else cols) * eb <= ROW_CACHE_BYTES
        if cache and static is None and not self.cache_fits(model, kernel(threads, rows), extent, target, sizes):
            cache = False  # the kept row at the widest width overflows shared memory (the smem-budget rule)
        share = 1
        # a static row too long for one block is shared by a cluster of blocks, about 32768 columns and
        # 512 threads each, its part kept in registers (H200, 2026-12-01, 2048 x 131072 bf16: softmax
        # 659.5 -> 433.1 µs, RMSNorm 480.3 -> 300.5, uncached before; torch 557.5 and 427.5)
        if not cache and static is not None and target.tma:
            share = 2
            while share < 8 and static // share > 32768:
                share *= 2
            if static % (share * vec) == 0 and static // share * eb <= ROW_CACHE_BYTES:
                threads, rows, cache = 512, 1, True
            else:
                share = 1
        # a block whose row in registers fills the SM's registers, and which computes a special function
        # of every column, loads its next row while it computes this one (H200, 2026-12-01, 8192 rows:
        # softmax at 32768 columns 322.9 -> 296.4 µs, LayerNorm 284.6 -> 287.2; it lost where the SM
        # holds two blocks, which overlap by themselves: softmax at 16384 138.1 -> 151.9, and for RMSNorm
        # at 32768 columns 264.5 -> 284.0)
        prefetch = False
        if static is not None and share == 1 and rows == 1 and cache and target.cp_async:
            lw = lower_rows(model, kernel(threads))
            prefetch = lw.one_block_per_sm(sizes) and column_functions(lw.expression()) > 0 \
                and len(lw.kept_rows()) == 1  # the next row's copy holds one kept row
        if static is not None and share == 1 and rows == 1 and cache and not prefetch \
                and (halved := self.two_blocks(model, kernel(threads), sizes)) is not None:
            return kernel(halved, rows, cache, share, False, 2)
        return kernel(threads, rows, cache, share, prefetch)

    @staticmethod
    def two_blocks(model: Model, base: RowKernel, sizes: dict[str, int]) -> int | None:
        """Half the threads, two blocks an SM (`blocks_per_sm`), for a block that keeps several rows in
        registers (a backward's dY and X) and alone fills the SM's registers, where the halved block still
        keeps them in registers within what two blocks leave a thread; None otherwise. H200, 8192 ×
        16384 bf16, 2026-12-02: RMSNorm backward 229.1 -> 193.9 µs (84% -> 99% of copy), softmax backward
        249.6 -> 199.9 µs (77% -> 96%); 512 threads bounded to two blocks 216.3 / 228.3, prefetching the
        next row 212.8 / 275.7, a cluster of two 203.9 / 245.7."""
        lw = lower_rows(model, base)
        if len(lw.kept_rows()) < 2 or not lw.one_block_per_sm(sizes) or base.threads < 64:
            return None
        half = lower_rows(model, replace(base, threads=base.threads // 2, blocks_per_sm=2))
        chunks = half.register_chunks(sizes) * len(half.kept_rows())
        fits = chunks > 0 and row_registers(chunks) <= registers_per_thread(base.threads // 2, base.rows_per_block, 2)
        return base.threads // 2 if fits else None

    def region_variants(self, model: Model, region: Region, base: Kernel, target: Target,
                        sizes: dict[str, int]) -> Iterator[Kernel]:
        return self.variants(base, target, row_extent(model, region).size)

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        """Threads per row (a block, or a warp with several rows a block), the row cached or not; for
        a long static row (`row_length`) on a target with clusters, a cluster of blocks sharing each row."""
        assert isinstance(base, RowKernel)
        cols = row_length
        for threads, cache in itertools.product((64, 128, 256, 512, 1024), (True, False)):
            yield replace(base, threads=threads, cache_row=cache, rows_per_block=1, cluster=1, prefetch=False,
                          blocks_per_sm=1)
        for rows, cache in itertools.product((1, 2, 4, 8), (True, False)):  # a warp per row
            yield replace(base, threads=32, cache_row=cache, rows_per_block=rows, cluster=1, prefetch=False,
                          blocks_per_sm=1)
        if target.clusters and cols is not None and cols >= 16384:
            for share, threads in itertools.product((2, 4, 8), (256, 512, 1024)):
                if cols % (share * base.vector) == 0:
                    yield replace(base, threads=threads, cache_row=True, rows_per_block=1, cluster=share,
                                  blocks_per_sm=1)
        # a row in registers with launch bounds that fit two blocks on an SM (ptxas caps the registers: the
        # one block of 512 threads holding dY's and X's rows of 16384 columns, 83 registers, fills the SM)
        if cols is not None and cols >= 8192:
            for threads in (256, 512):
                yield replace(base, threads=threads, cache_row=True, rows_per_block=1, cluster=1, prefetch=False,
                              blocks_per_sm=2)
        # persistent blocks that copy their next row while they compute this one (in registers); not in
        # a cluster, where it lost everywhere (H200, 2026-12-01: softmax 2048x131072 433.7 -> 720.0 µs)
        if cols is not None and cols >= 8192:
            for threads in (256, 512, 1024):
                yield replace(base, threads=threads, cache_row=True, rows_per_block=1, cluster=1, prefetch=True,
                              blocks_per_sm=1)

    def smem_bytes(self, lowering: RowLowering, sizes: dict[str, int] | None = None) -> int:  # type: ignore[override]
        """The cached rows' part of a block (0 when the row is not cached, no row is kept, or its length
        is unknown): each kept row as its element type, as the smem-budget rule and the emitter count it."""
        k, kept = lowering.kernel, lowering.kept_row()
        if not k.cache_row or kept is None or sizes is None:
            return 0
        e = DTYPES[kept.dtype].bytes * len(lowering.kept_rows())
        return e * sizes[lowering.c] * k.rows_per_block // k.cluster

    def cache_fits(self, model: Model, kernel: RowKernel, extent: Extent, target: Target,
                   sizes: dict[str, int]) -> bool:
        """Whether `kernel`'s cached row fits the target's shared memory at the widest row of the
        runtime `extent` (as the smem-budget rule counts it: the kept row's element type)."""
        widest = dict(sizes) | {extent.name: extent.hi}
        return self.smem_bytes(lower_rows(model, kernel), widest) <= target.smem_per_block

    def registers(self, lowering: RowLowering) -> int:  # type: ignore[override]
        return 0

    def emit(self, name: str, model: Model, lowering: RowLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        return emit_rows(name, model, lowering, static)


PATH = RowsPath()
