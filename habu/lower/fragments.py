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


@dataclass(frozen=True)
class OperandFragment:
    """Where ldmatrix puts an m16n8k16 operand: one `ldmatrix.m8n8.x{matrices}` fills the operand's
    registers, matrix j into register j, and register j of the mma operand holds the 8x8 block
    (`block(j)`: its mn block j % mn_blocks, k block j / mn_blocks) — A (16 x 16, m x k): a0a1 (m 0-7,
    k 0-7), a2a3 (m 8-15), a4a5 (k 8-15), a6a7 (both); B (16 x 8, k x n): b0b1 (k 0-7), b2b3 (k 8-15)
    (PTX ISA, "Matrix fragments for mma.m16n8k16"). Lanes 8j .. 8j + 7 point ldmatrix at the eight
    stored rows of matrix j: rows along mn when the operand is stored k-contiguous (plain ldmatrix:
    register j gets row lane/4, the k pair 2·(lane%4)), rows along k when stored mn-contiguous
    (`.trans`: register j gets the k pair 2·(lane%4) of column lane/4), so the same registers hold the
    same operand elements either way round and the mma is unchanged.

    `read_shape(trans)` is that lane map in `habu.lower.layouts.LdmatrixRead`'s terms: lane l points at
    stored row l % row_lanes + (l / (row_lanes·col_groups)) · row_lanes, column ((l / row_lanes) %
    col_groups) · 8."""

    mn_blocks: int  # 8-wide blocks along m (A: 2) or n (B: 1)
    k_blocks: int = 2  # 8-deep blocks along k (k16)

    @property
    def matrices(self) -> int:
        return self.mn_blocks * self.k_blocks

    def block(self, register: int) -> tuple[int, int]:
        """(mn block, k block) of the operand that register `register` (ldmatrix matrix) holds."""
        return register % self.mn_blocks, register // self.mn_blocks

    def read_shape(self, trans: bool) -> tuple[int, int, int]:
        """(row_lanes, col_groups, row_blocks) of the ldmatrix lane map (see the class doc): the lanes of
        consecutive matrices step along the stored rows where the blocks they read lie below each
        other, else along the columns."""
        if not trans:  # stored rows along mn: matrices j, j+1 (mn blocks) lie below each other
            return 8 * self.mn_blocks, self.k_blocks, 1
        if self.mn_blocks == 1:  # stored rows along k: the k blocks lie below each other
            return 8 * self.k_blocks, 1, 1
        return 8, self.mn_blocks, self.k_blocks  # mn blocks side by side, then the next k block below


A_OPERAND = OperandFragment(2)  # ldmatrix.x4 per m16 x k16 A tile
B_OPERAND = OperandFragment(1)  # ldmatrix.x2 per k16 x n8 B tile

__all__ = ["ACCUMULATOR", "A_OPERAND", "B_OPERAND", "AccumulatorFragment", "OperandFragment"]
