"""The grouped GEMM's mma.sync main loop (`GroupedKernel.main_loop = "mma.sync"`): its shared-memory tiles,
the copies that fill them, the warps' operand words and the epilogue's accumulator map, as the contraction
path's objects (habu/lower/layouts.py, fragments.py) hold them.

    A's bm × bk and W's bn × bk k tile: `SmemTile`s of bk + 8 bf16 a row (16 bytes of padding against bank
        conflicts), filled by `StageCopy`s of 16-byte chunks: chunk e = tid + q·threads holds the operand's
        row e / (bk/8), k (e % (bk/8))·8 (`along`), stored at the tile's (row, k) (`storage`)
    warp w: its tile origin (`WarpGrid`: wm = w % warps_m, wn = w / warps_m)
    the m16n8k16 operand registers: one 32-bit word each, lane l's register j of A holding the words at row
        wm·warp_rows + i·16 + l/4 + 8·(j % 2), k ks + 2·(l % 4) + 8·(j / 2) (`OperandFragment.block`: the
        8×8 block register j holds), of W at column wn·warp_cols + j'·8 + l/4, k likewise (`WordRead`)
    the epilogue: register q of accumulator (i, j) at row i·16 + l/4 + 8·(q/2), column j·8 + 2·(l%4) + q%2
        of the warp's tile (`AccumulatorFragment.element`)

The finite-field check routes the operands through these maps (habu.prove.grouped_route: each chunk's
identity written where its copy puts it, each register's words read back and compared with the PTX ISA's
operand layout), so a copy, a word or a fragment at another element changes the result; the emitter prints
each of them from here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from habu.lower.fragments import A_OPERAND, ACCUMULATOR, B_OPERAND, AccumulatorFragment, OperandFragment
from habu.lower.layouts import SmemTile, StageCopy, WarpGrid
from habu.plan.plan import GroupedKernel

MMA_M, MMA_N, MMA_K = 16, 8, 16  # mma.sync m16n8k16
PAD = 8  # bf16 elements of padding a staged row carries (16 bytes)
CHUNK = 8  # bf16 elements of one staged 16-byte chunk


@dataclass(frozen=True)
class WordRead:
    """An m16n8k16 operand read from shared memory one 32-bit word (two bf16 along k) a register: lane l's
    register j holds the word at (mn, k) = (8·mn block + l / lanes_per_row, 8·k block + pair·(l %
    lanes_per_row)) of the fragment, its blocks `operand.block(j)` (the PTX ISA's m16n8k16 A and B
    fragments: a0a1 rows 0-7 k 0-7, a2a3 rows 8-15, a4a5 k 8-15; b0b1 k 0-7, b2b3 k 8-15)."""

    operand: OperandFragment
    lanes_per_row: int = 4
    pair: int = 2  # bf16 elements of a word

    @property
    def registers(self) -> int:
        return self.operand.matrices

    def lane_mn(self, lane: Any) -> Any:
        """The fragment's row (A: m, B: n) lane `lane` reads, in its first block."""
        return lane // self.lanes_per_row

    def lane_k(self, lane: Any) -> Any:
        """The fragment's k lane `lane` reads, in its first block."""
        return (lane % self.lanes_per_row) * self.pair

    def word(self, register: int) -> tuple[int, int]:
        """(mn, k) steps from the lane's first word to register `register`'s: its block's origin."""
        mn_block, k_block = self.operand.block(register)
        return 8 * mn_block, 8 * k_block


@dataclass(frozen=True)
class GroupedMmaLoop:
    """The mma.sync main loop's maps (see the module doc)."""

    threads: int
    grid: WarpGrid
    a_tile: SmemTile
    w_tile: SmemTile  # W's (and a pair's second weights': the same layout)
    a_copy: StageCopy
    w_copy: StageCopy
    a_read: WordRead
    w_read: WordRead
    bk: int
    mma_k: int = MMA_K  # the k of one mma: the k tile's steps ks = 0, mma_k, ...
    fragment: AccumulatorFragment = ACCUMULATOR
    warp_size: int = 32

    @property
    def mma_tiles(self) -> tuple[int, int]:
        """(m16 tiles, n8 tiles) of a warp's tile."""
        return self.grid.warp_rows // MMA_M, self.grid.warp_cols // MMA_N

    def copies(self, copy: StageCopy) -> int:
        """The copies each thread makes of one k tile of an operand."""
        return copy.count // self.threads

    def chunk(self, tid: Any, q: Any) -> Any:
        """The copy a thread makes at its q-th turn."""
        return tid + q * self.threads

    def lane(self, tid: Any) -> Any:
        return tid % self.warp_size

    def warp(self, tid: Any) -> Any:
        return tid // self.warp_size

    def a_row(self, wm: Any, i: Any, lane: Any) -> Any:
        """The tile row lane `lane` of warp row wm reads for m16 tile i (its first block's)."""
        return self.grid.row_origin(wm) + i * MMA_M + self.a_read.lane_mn(lane)

    def w_row(self, wn: Any, j: Any, lane: Any) -> Any:
        """The W tile row (the output column) lane `lane` of warp column wn reads for n8 tile j."""
        return self.grid.col_origin(wn) + j * MMA_N + self.w_read.lane_mn(lane)

    def k_col(self, ks: Any, lane: Any) -> Any:
        """The k a lane's first word starts at, at k step ks."""
        return ks + self.a_read.lane_k(lane)

    def accumulator(self, wm: Any, wn: Any, i: Any, j: Any, lane: Any, q: Any) -> tuple[Any, Any]:
        """The tile (row, column) register q of accumulator (i, j) of lane `lane` holds."""
        f = self.fragment
        row, col = f.element(0, lane, 0, q // f.pair, q % f.pair)
        return (self.grid.row_origin(wm) + i * MMA_M + row, self.grid.col_origin(wn) + j * MMA_N + col)

    def smem_bytes(self, a_parts: int, weights: int) -> int:
        return self.a_tile.bytes * a_parts + self.w_tile.bytes * weights


def grouped_mma_loop(kernel: GroupedKernel) -> GroupedMmaLoop:
    threads = 32 * kernel.warps_m * kernel.warps_n
    grid = WarpGrid(kernel.warps_m, kernel.bm // kernel.warps_m, kernel.bn // kernel.warps_n)
    a_tile = SmemTile(kernel.bm, kernel.bk + PAD, 2)
    w_tile = SmemTile(kernel.bn, kernel.bk + PAD, 2)
    return GroupedMmaLoop(threads, grid, a_tile, w_tile, StageCopy(kernel.bk, kernel.bm, CHUNK, True, a_tile),
                          StageCopy(kernel.bk, kernel.bn, CHUNK, True, w_tile), WordRead(A_OPERAND),
                          WordRead(B_OPERAND), kernel.bk)


__all__ = ["MMA_K", "MMA_M", "MMA_N", "GroupedMmaLoop", "WordRead", "grouped_mma_loop"]
