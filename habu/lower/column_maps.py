"""The column kernel's index maps as data: affine maps with their strides held as fields, so that the
lowering (`habu.lower.columns.ColumnLowering`), the finite-field interpreter
(`habu.prove.interp_columns`), the rules (`habu.prove.rules_columns`) and the emitter
(`habu.emit_cuda.emit_columns`) all read one object, and a change to any stride changes what each of
them runs or prints.

    thread t:        tc = t % column_threads, g = t / column_threads
    its columns:     tile·tile_columns + tc·column_stride + v          (v < vector)
    its block:       (tile, split) = (blockIdx.x, blockIdx.y)
    its rows:        begin + i·row_step + u·unroll_step + g          (i < steps, u < unroll), below row_end
                     (`row_live`: r < row_end; r ≤ row_end only in a planted bug, `end_inclusive`)
    a split's rows:  split·rows_per_split .. min(split·rows_per_split + rows_per_split, #R)
                     (#R: the rows, the product of the reduced leading extents: `ColumnLowering.rows`)
    the final pass:  the last of a column tile's row splits to finish (its arrival on the tile's counter,
                     slot tile·counter_stride of the launch's workspace, completes the count) finishes the
                     tile's columns: thread t slots j = t, t + final_step, ... < tile_columns, column
                     tile·tile_columns + j (decoding a max's keys or computing the epilogue:
                     `ColumnLowering.final_pass`)
    partial slots:   g·group_stride + tc·thread_stride + v·value_stride   (slots of shared memory)
    the combine:     thread t reads slots g·group_stride + j for j = t, t + combine_step, ... < tile_columns,
                     and stores column tile·tile_columns + j
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from habu.lower.access import minimum
from habu.plan.plan import ColumnKernel


@dataclass(frozen=True)
class ColumnThreadMap:
    """Which columns and rows each thread of a column kernel visits."""

    threads: int
    column_threads: int
    vector: int  # adjacent columns a thread owns
    unroll: int  # rows a thread loads before adding them
    row_groups: int
    tile_columns: int  # columns a block owns
    column_stride: int  # columns between neighbouring column threads
    rows_per_split: int
    row_step: int  # rows an iteration of the row loop advances
    unroll_step: int  # rows between a thread's unrolled rows
    steps: int  # iterations of the row loop
    final_step: int  # slots between a last-block thread's columns of its tile in the final pass
    counter_stride: int  # slots of the per-launch counters between neighbouring column tiles' counters
    end_inclusive: bool = False  # the row mask r ≤ row_end (a planted bug; the lowering never sets it)

    def column_thread(self, t: Any) -> Any:
        return t % self.column_threads

    def row_group(self, t: Any) -> Any:
        return t // self.column_threads

    def thread_column(self, tile: Any, tc: Any, v: Any) -> Any:
        return tile * self.tile_columns + tc * self.column_stride + v

    def block(self, bx: Any, by: Any) -> tuple[Any, Any]:
        """(column tile, row split) of the block at grid coordinates (bx, by)."""
        return bx, by

    def row_live(self, r: Any, end: Any) -> Any:
        """Whether row r of a split (ending before `end`) is one of its rows."""
        return r <= end if self.end_inclusive else r < end

    def row_begin(self, split: Any) -> Any:
        return split * self.rows_per_split

    def row_end(self, split: Any, rows: Any) -> Any:
        return minimum(split * self.rows_per_split + self.rows_per_split, rows)

    def row(self, begin: Any, i: Any, u: Any, g: Any) -> Any:
        return begin + i * self.row_step + u * self.unroll_step + g

    def tile_column(self, tile: Any, j: Any) -> Any:
        return tile * self.tile_columns + j

    def final_start(self, tid: Any) -> Any:
        return tid

    def counter_slot(self, tile: Any) -> Any:
        return tile * self.counter_stride


@dataclass(frozen=True)
class ColumnPartials:
    """The block's shared-memory partials: where each thread writes its columns' partials and where the
    combining threads read them."""

    slots: int  # floats of shared memory
    group_stride: int
    thread_stride: int
    value_stride: int
    combine_step: int  # slots between a combining thread's rounds

    def partial_slot(self, g: Any, tc: Any, v: Any) -> Any:
        return g * self.group_stride + tc * self.thread_stride + v * self.value_stride

    def combined_slot(self, g: Any, j: Any) -> Any:
        return g * self.group_stride + j

    def combine_start(self, tid: Any) -> Any:
        return tid


def column_maps(kernel: ColumnKernel) -> tuple[ColumnThreadMap, ColumnPartials]:
    """The maps of a column kernel's schedule."""
    groups = kernel.threads // kernel.column_threads
    tile = kernel.column_threads * kernel.vector
    # (no row group: a block of fewer threads than its column threads, which the supported-path rule refuses)
    steps = -(-kernel.rows_per_split // (max(1, groups) * kernel.unroll))
    threads = ColumnThreadMap(kernel.threads, kernel.column_threads, kernel.vector, kernel.unroll, groups, tile,
                              kernel.vector, kernel.rows_per_split, groups * kernel.unroll, groups, steps,
                              kernel.threads, 1)
    return threads, ColumnPartials(groups * tile, tile, kernel.vector, 1, kernel.threads)


__all__ = ["ColumnPartials", "ColumnThreadMap", "column_maps"]
