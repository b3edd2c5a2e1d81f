"""Accumulator fragments: which output element each register of each thread holds, as an epilogue
reads them.

mma.sync m16n8k16 (its C/D fragment) and wgmma m64nNk16 (its D fragment, per warp of the warpgroup)
lay an f32 accumulator out the same way: register pair (j, h) of lane `lane` in warp `warp` holds
row `warp·16 + lane/4 + 8·h` and columns `8·j + 2·(lane%4) + q`, q = 0, 1 (PTX ISA, "Matrix fragments
for mma.m16n8k16" and "wgmma D matrix fragments"). The epilogues print these expressions from an
`AccumulatorFragment` held by the lowering, and the thread decode that gives each thread its lane and
warp (`lane_of`, `warp_of`); the finite-field check runs the same object, thread by thread, against the
instruction's layout as the PTX ISA states it (`habu.prove.fragments`), so an epilogue that stores a
register at another element than the one it holds is caught on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AccumulatorFragment:
    """The epilogue's map from (warp, lane, j, h, q) to (row, column) within a fragment tile."""

    warp_rows: int = 16  # rows per warp of a warpgroup (wgmma: 4 warps × 16 = 64 rows)
    lanes_per_row: int = 4  # lanes sharing one row
    row_step: int = 8  # h selects the row lane/4 or lane/4 + row_step
    col_step: int = 8  # j selects the 8-column group
    pair: int = 2  # adjacent columns a lane holds (q = 0, 1)
    halves: int = 2  # the row halves h a lane holds (rows lane/4 and lane/4 + row_step)
    # the thread decode: thread x of a warpgroup is lane x % warp_size of warp (x % (warp_size·group_warps))
    # / warp_size (other values only in planted bugs: the PTX ISA fixes both)
    warp_size: int = 32
    group_warps: int = 4

    # -- as C text, in the emitters' spelling
    def lane_of(self, x: str = "threadIdx.x") -> str:
        return f"{x} % {self.warp_size}"

    def warp_of(self, x: str = "threadIdx.x") -> str:
        """The warp within its warpgroup (wgmma's accumulator rows are per warp of the warpgroup)."""
        return f"({x} % {self.warp_size * self.group_warps}) / {self.warp_size}"

    def row_in_warp(self) -> str:
        return f"lane / {self.lanes_per_row} + {self.row_step} * h"

    def row_in_warpgroup(self) -> str:
        return f"warp * {self.warp_rows} + {self.row_in_warp()}"

    def col_in_group(self) -> str:
        return f"{self.pair} * (lane % {self.lanes_per_row})"

    def col(self, j: str = "j") -> str:
        return f"{self.col_step} * {j} + {self.col_in_group()}"

    def register_in_group(self, q: int) -> str:
        """The register of pair h, column q within one 8-column group (mma.sync: of one m16n8 tile)."""
        return f"{self.pair} * h" + (f" + {q}" if q else "")

    def register(self, q: int) -> str:
        """The register of (j, h, q) in a wgmma accumulator (groups of 2·pair registers per j)."""
        return f"{2 * self.pair} * j + {self.register_in_group(q)}"

    # -- as integers (numpy arrays or ints)
    def thread_lane(self, x: Any) -> Any:
        return x % self.warp_size

    def thread_warp(self, x: Any) -> Any:
        return (x % (self.warp_size * self.group_warps)) // self.warp_size

    def register_index(self, j: Any, h: Any, q: Any) -> Any:
        return 2 * self.pair * j + self.pair * h + q

    def registers(self, column_groups: int) -> int:
        """The accumulator registers a thread holds over `column_groups` 8-column groups (one past the
        last `register_index`): the array the epilogue declares (wgmma: acc[slab][registers], mma.sync:
        acc[mi][ni][registers(1)])."""
        return self.register_index(column_groups - 1, self.halves - 1, self.pair - 1) + 1

    def element(self, warp: Any, lane: Any, j: Any, h: Any, q: Any) -> tuple[Any, Any]:
        row = warp * self.warp_rows + lane // self.lanes_per_row + self.row_step * h
        col = self.col_step * j + self.pair * (lane % self.lanes_per_row) + q
        return row, col


ACCUMULATOR = AccumulatorFragment()

__all__ = ["ACCUMULATOR", "AccumulatorFragment"]
