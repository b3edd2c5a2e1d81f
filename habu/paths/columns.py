"""The column path: a reduction over the leading axis, one value per column (`G[n] = Σ r dY[r n]`, the bias
gradient): a grid of column tiles × row splits, each thread a packed vector of adjacent columns and a
few rows in flight, the block's row groups combined in shared memory, the splits added atomically.
habu/lower/columns.py lowers it, habu/emit_cuda/emit_columns.py prints it; its analytic default
(`default_kernel`), its search space (`variants`) and its cost term (`seconds`) are here."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import replace

from habu.emit_cuda.emit_columns import emit_columns
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.columns import ColumnLowering
from habu.lower.flatten import row_count
from habu.lower.support import COLUMNS
from habu.paths.analytic import max_vector, multiples, needs_64bit
from habu.paths.base import KernelPath
from habu.plan.patterns import Region, as_column_reduction, column_node
from habu.plan.plan import ColumnKernel, Kernel
from habu.plan.storage import dtype_bytes, dtype_of
from habu.spec.dtypes import DTYPES
from habu.spec.ir import INT31_MAX, Load, Model, walk
from habu.target import Target

# bytes of loads a resident SM keeps in flight to hide DRAM latency at full bandwidth (Little's law:
# ~4.8 TB/s × ~0.8 µs over 132 SMs ≈ 29 KB; a 16-byte load per thread per row in flight)
BYTES_IN_FLIGHT_PER_SM = 32 * 1024
# blocks per SM the default aims the grid at: one wave of equal blocks, every block resident at once (a
# 256-thread block of 64 registers leaves room for 4 an SM), so no block waits for a second wave
BLOCKS_PER_SM = 4
# registers a thread of the default needs (8 accumulators, 8 packed 16-byte loads, addresses: ptxas
# reports 64 for 8192 × 14336 bf16, 40 with 4 rows in flight): the cost model's guess of the blocks an SM holds
REGISTERS = 64


def default_kernel(nodes: tuple[str, ...], rows: int, cols: int, elem_bytes: int, out_f32: bool, op: str,
                   vector: int, target: Target, index_width: int) -> ColumnKernel:
    """The analytic default: 256 threads of `vector` adjacent columns each (16-byte loads where the row
    length allows), 32 column threads (a warp reads 32 × 16 contiguous bytes of a row) × 8 row groups, 8
    rows in flight a thread (256 × 8 × 16 = 32 KB a block: one block an SM reaches BYTES_IN_FLIGHT_PER_SM,
    the 3 to 4 of the default's grid have 3 to 4 times it, for the latency of a loaded memory system),
    and the rows split so the grid is one wave of at most BLOCKS_PER_SM blocks per SM (into an f32 output:
    a Σ's splits add atomically, a max's take the max of order-preserving keys; a 16-bit output takes one
    split). Narrow outputs trade column threads for row groups."""
    threads, column_threads, unroll = 256, 32, 8
    tile = column_threads * vector
    while column_threads > 1 and tile // 2 >= cols:
        column_threads //= 2  # narrow outputs: fewer column threads, more row groups
        tile = column_threads * vector
    tiles = -(-cols // tile)
    if not out_f32:  # a 16-bit output: one split stores it (the splits combine atomically in f32 only)
        split = rows
        # one split: the column tiles alone fill the GPU, so narrow them (to 4 column threads, a warp still
        # reading 64 contiguous bytes of each of its 8 rows) until there are two blocks an SM
        while column_threads > 4 and tiles < 2 * target.sm_count:
            column_threads //= 2
            tile = column_threads * vector
            tiles = -(-cols // tile)
    else:
        per_loop = threads // column_threads * unroll
        want = max(1, (target.sm_count * BLOCKS_PER_SM) // tiles)  # splits per column tile
        split = -(-rows // want)
        split = max(per_loop, -(-split // per_loop) * per_loop)  # whole row loops
    return ColumnKernel(nodes=nodes, threads=threads, column_threads=column_threads, vector=vector,
                        rows_per_split=max(1, split), unroll=unroll, index_width=index_width)


class ColumnsPath(KernelPath):
    support = COLUMNS

    def default(self, model: Model, region: Region, target: Target, sizes: dict[str, int]) -> ColumnKernel:
        """`default_kernel` for the region's reduction: 16-byte loads of the widest row-column operand
        where the row length allows, 32-bit indices where every row a thread computes (masked or not)
        stays below 2^31 elements."""
        col = as_column_reduction(column_node(model, region.nodes))
        assert col is not None
        rows = row_count(tuple(v.extent for v in col.rs), sizes)
        if col.n is None:  # a scalar output: one column, one value a thread, the rows split over the grid
            cols, wide, vec = 1, [], 1
        else:
            cols = sizes[col.n.extent]
            static = next((e.size for e in model.extents if e.name == col.n.extent), None)
            wide = [dtype_bytes(model, x.tensor) for x in walk(col.node.rhs)
                    if isinstance(x, Load) and x.indices == (*col.rs, col.n)]
            vec = max_vector(static, max(wide, default=4), multiples(model).get(col.n.extent, 1))
        out_f32 = dtype_of(model, region.output) == "f32"
        base = default_kernel(region.nodes, rows, cols, max(wide, default=4), out_f32, col.op, vec, target, 32)
        wide_rows = rows + base.rows_per_split + base.threads * base.unroll  # the rows a thread computes
        narrow = not needs_64bit(model, sizes) and wide_rows * cols + cols <= INT31_MAX
        return replace(base, index_width=32 if narrow else 64)

    def region_variants(self, model: Model, region: Region, base: Kernel, target: Target,
                        sizes: dict[str, int]) -> Iterator[Kernel]:
        col = as_column_reduction(column_node(model, region.nodes))
        assert col is not None
        return self.variants(base, target, row_count(tuple(v.extent for v in col.rs), sizes))

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        """Columns per thread (the default's vector, and 1), threads (128, 256, 512) with 16, 32 or 64
        column threads (and the default's), unroll 2/4/8, and rows per split from an eighth of the
        default's to 8 times it (a 16-bit output keeps its one split)."""
        assert isinstance(base, ColumnKernel)
        one_split = base.rows_per_split == row_length if row_length is not None else False
        splits = (base.rows_per_split,) if one_split else tuple(
            sorted({max(1, base.rows_per_split * f // 8) for f in (1, 2, 4, 8, 16, 32, 64)}))
        for vec, threads, ct, unroll, rows in itertools.product(
                sorted({1, base.vector}), (128, 256, 512), sorted({16, 32, 64, base.column_threads}), (2, 4, 8),
                splits):
            if ct > threads:
                continue
            yield replace(base, vector=vec, threads=threads, column_threads=ct, unroll=unroll, rows_per_split=rows)

    def seconds(self, lw: ColumnLowering, sizes: Mapping[str, int], target: Target) -> tuple[float, float]:
        """The cost model's term: (bytes moved, seconds). The loads stream at the copy bandwidth times the
        share of it the bytes in flight sustain (per SM: the blocks it holds × threads × unroll × bytes a
        row's loads move, against BYTES_IN_FLIGHT_PER_SM), times the balance of blocks over SMs (a last
        wave that leaves SMs idle), plus the splits' atomic adds and the launch."""
        k, c = lw.kernel, target.ceilings
        R, C = lw.rows(sizes), lw.columns(sizes)
        moved, per_row = 0.0, 0
        for _, acc in lw.loads:
            e = DTYPES[acc.dtype].bytes
            kind = lw.kind_of(acc)
            moved += e * (R * C if kind in ("row-column", "column-row") else R if kind == "row" else C)
            per_row += e * k.vector if kind in ("row-column", "column-row") else 0
        splits = int(lw.splits(sizes))
        atomics = 8.0 * C * splits if lw.combine in ("atomic", "atomic-max") else 4.0 * C
        blocks = int(lw.tiles(sizes)) * splits
        resident = max(1, min(2048 // k.threads, 65536 // (REGISTERS * k.threads), 32))
        held = min(float(resident), blocks / target.sm_count)  # blocks an SM holds at once, on average
        feed = min(1.0, held * k.threads * k.unroll * max(1, per_row) / BYTES_IN_FLIGHT_PER_SM)
        slots = target.sm_count * (resident if blocks > target.sm_count * resident else 1)
        balance = blocks / (-(-blocks // slots) * slots)
        seconds = moved / (c.bandwidth * 0.95 * feed * balance) + atomics / c.bandwidth + c.launch_s
        return moved + atomics, seconds

    def smem_bytes(self, lowering: ColumnLowering) -> int:  # type: ignore[override]
        return lowering.smem_bytes

    def registers(self, lowering: ColumnLowering) -> int:  # type: ignore[override]
        return 0

    def emit(self, name: str, model: Model, lowering: ColumnLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        return emit_columns(name, model, lowering, static)


PATH = ColumnsPath()
