"""A contraction's staging pass: an operand copied (its gather applied) into an aligned buffer the product then
loads plainly with TMA at any #K (`ContractionKernel.a_move`/`b_move` = staged)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from habu.lower.access import Access, Bound, Position, cdiv

STAGE_ALIGN = 8  # elements: staged rows start at multiples of 16 bytes for 2-byte types


@dataclass(frozen=True)
class StageLowering:
    """A pre-pass: dst[row, k] = src at (row, k) for row < rows, k < K (the gather happens here).

    dst's rows are STAGE_ALIGN-rounded, so the contraction can load it with TMA at any #K."""

    src: Access  # over axes "row" and "k"
    dst: Access
    rows: str  # extent of the rows
    k: str
    threads: int = 256
    # 0: a block copies `threads` columns of one row; T: a block copies a T x T tile through shared
    # memory, reading along the rows and writing along k (src is contiguous along its rows: a
    # transposing copy, such as a (K, N) weight staged K-major)
    tile: int = 0

    def grid(self, s: Mapping[str, Any], sm_count: int = 0) -> tuple[Any, Any]:
        """(blocks along k, blocks along the rows)."""
        if self.tile:
            return cdiv(s[self.k], self.tile), cdiv(s[self.rows], self.tile)
        return cdiv(s[self.k], self.threads), s[self.rows]


@cache
def staged(src: Access, axis: str, rows: str, k: str, suffix: str = "") -> tuple[Access, StageLowering]:
    """Stage an operand: the pass reads it as the contraction did (gather included) and writes
    @name[row, k] with rows STAGE_ALIGN elements apart; the contraction then reads @name plainly. `suffix`
    names a second copy of the same tensor (S·S with both operands staged: `@S` and `@S_b`)."""
    padded = f"{k}^{STAGE_ALIGN}"
    dst = Access(f"@{src.tensor}{suffix}", src.dtype, (rows, padded), (Position("axis", axis), Position("axis", "k")),
                 ((padded,), ()), (Bound(axis, rows), Bound("k", k)))
    last = src.positions[-1]
    transposing = last.kind == "axis" and last.axis == axis  # src's rows are its contiguous dimension
    return dst, StageLowering(src, dst, rows, k, tile=TRANSPOSE_TILE if transposing else 0)


TRANSPOSE_TILE = 32  # a transposing staging pass moves 32 x 32 tiles (256 threads, 4 elements each)


def main_loop_move(mma: str, move: str, vector: int, elem_bytes: int) -> str:
    """How a contraction's main loop moves an operand's tiles into shared memory: its movement (`a_move`,
    `b_move`), except a staged operand, whose pass copies its rows into a buffer of 16-byte-aligned rows: wgmma
    reads that buffer by TMA, mma.sync by cp.async of `vector` elements, or by ldg where a vector is under the
    4 bytes cp.async copies at least (the unguarded member of a kernel set reads it one element at a time)."""
    if move != "staged":
        return move
    if mma == "wgmma":
        return "tma"
    return "cp.async" if vector * elem_bytes >= 4 else "ldg"


__all__ = ["STAGE_ALIGN", "TRANSPOSE_TILE", "StageLowering", "main_loop_move", "staged"]
