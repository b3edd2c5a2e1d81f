"""A contraction's staging pass: an operand copied (its gather applied) into an aligned buffer the product then
loads plainly with TMA at any #K (`ContractionKernel.a_move`/`b_move` = staged)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from habu.lower.access import Access, Bound, Position, cdiv, row_major_strides, size_of
from habu.lower.batch_axes import batch_coordinates, is_batch_axis

STAGE_ALIGN = 8  # elements: staged rows start at multiples of 16 bytes for 2-byte types
# a main loop's vectors over a staged buffer (cp.async on mma.sync): its rows start 16 bytes apart and its padding
# holds zeros, so 16-byte vectors along k fit at any #K (`StageLowering.dst` runs to the padded row)
STAGED_VECTOR_BYTES = 16


@dataclass(frozen=True)
class StageLowering:
    """A pre-pass: dst[batch..., row, k] = src at (batch..., row, k) for row < rows, k < K (the gather happens
    here), for every batch of a batched contraction the operand reads (`batch`: those batch axes of
    `habu.lower.batch_axes` and their extents, outermost first: the pass's grid.z, as the batches are the
    contraction's).

    dst's rows are STAGE_ALIGN-rounded, so the contraction can load it with TMA at any #K. The pass writes the
    padding too, zeros (dst is bounded by the padded row, k < K^8, the source read as 0 past #K; the product reads
    the buffer bounded by #K): a main loop reading it in vectors along k (cp.async; a vector's mask is its first
    element's) may then end a vector in the padding, as at K = 511 an 8-element vector from k = 504."""

    src: Access  # over axes "row" and "k"
    dst: Access  # as the pass writes it: k < K^8 (the padding's zeros)
    rows: str  # extent of the rows
    k: str
    threads: int = 256
    # 0: a block copies `threads` columns of one row; T: a block copies a T x T tile through shared
    # memory, reading along the rows and writing along k (src is contiguous along its rows: a
    # transposing copy, such as a (K, N) weight staged K-major)
    tile: int = 0
    batch: tuple[tuple[str, str], ...] = ()  # (batch axis, its extent) the operand reads, outermost first

    def grid(self, s: Mapping[str, Any], sm_count: int = 0) -> tuple[Any, Any]:
        """(blocks along k, blocks along the rows)."""
        if self.tile:
            return cdiv(self.row_length(s), self.tile), cdiv(s[self.rows], self.tile)
        return cdiv(self.row_length(s), self.threads), s[self.rows]

    @property
    def padded(self) -> str:
        """The extent the pass writes along k: the buffer's row length, #K rounded up (`K^8`)."""
        return next(b.extent for b in self.dst.masks if b.axis == "k")

    def row_length(self, s: Mapping[str, Any]) -> Any:
        return size_of(self.padded, s)

    @property
    def row_axis(self) -> str:
        """The axis of the buffer's rows (m for A, n for B)."""
        return self.dst.positions[-2].axis

    def batches(self, s: Mapping[str, Any]) -> Any:
        """The grid's z: one slab of blocks per batch (1 when not batched)."""
        n: Any = 1
        for _axis, e in self.batch:
            n = n * s[e]
        return n

    def batch_coordinates(self, z: Any, s: Mapping[str, Any], let: Any = None) -> dict[str, Any]:
        """The batch axes' coordinates of the pass's block slab z (blockIdx.z; the last axis varies fastest)."""
        return batch_coordinates(tuple(e for _a, e in self.batch), z, s, let, tuple(a for a, _e in self.batch))


@cache
def staged(src: Access, axis: str, rows: str, k: str, suffix: str = "", batch: tuple[tuple[str, str], ...] = ()
           ) -> tuple[Access, StageLowering]:
    """Stage an operand: the pass reads it as the contraction did (gather included) and writes
    @name[batch..., row, k] with rows STAGE_ALIGN elements apart (zeros past #K); the contraction then reads @name
    plainly (the access returned, bounded by #K).
    `suffix` names a second copy of the same tensor (S·S with both operands staged: `@S` and `@S_b`). `batch`:
    a batched contraction's (batch axis, extent) pairs, outermost first; the buffer keeps those the operand
    reads as its outer dimensions (an operand shared by every batch is copied once)."""
    read = {p.axis for p in src.positions if p.kind == "axis" and is_batch_axis(p.axis)}
    kept = tuple((a, e) for a, e in batch if a in read)
    padded = f"{k}^{STAGE_ALIGN}"
    extents = (*(e for _a, e in kept), rows, padded)
    positions = (*(Position("axis", a) for a, _e in kept), Position("axis", axis), Position("axis", "k"))
    dst = Access(f"@{src.tensor}{suffix}", src.dtype, extents, positions, row_major_strides(extents),
                 (Bound(axis, rows), Bound("k", padded)))
    read = replace(dst, masks=(Bound(axis, rows), Bound("k", k)))  # the product's: the ragged k tile masked at #K
    last = src.positions[-1]
    transposing = last.kind == "axis" and last.axis == axis  # src's rows are its contiguous dimension
    return read, StageLowering(src, dst, rows, k, tile=TRANSPOSE_TILE if transposing else 0, batch=kept)


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


__all__ = ["STAGED_VECTOR_BYTES", "STAGE_ALIGN", "TRANSPOSE_TILE", "StageLowering", "main_loop_move", "staged"]
