"""A contraction's staging pass: an operand copied (its gather applied) into an aligned buffer the product then
loads plainly with TMA at any #K (`ContractionKernel.a_move`/`b_move` = staged).

The pass's thread maps live here, as the rest of a kernel's index arithmetic does: which element each block starts
at (`StageLowering.origin`), which element a thread moves (`StageLowering.element`, `StageTile.load_lane`,
`store_lane`) and where a tile pass keeps it in shared memory (`StageTile.slot`). The emitter prints them and the
finite-field check runs them block by block (habu/prove/interp_stage.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from habu.lower.access import Access, Bound, Position, cdiv, floordiv, row_major_strides, size_of
from habu.lower.batch_axes import batch_coordinates, is_batch_axis

STAGE_ALIGN = 8  # elements: staged rows start at multiples of 16 bytes for 2-byte types
# a main loop's vectors over a staged buffer (cp.async on mma.sync): its rows start 16 bytes apart and its padding
# holds zeros, so 16-byte vectors along k fit at any #K (`StageLowering.dst` runs to the padded row)
STAGED_VECTOR_BYTES = 16


@dataclass(frozen=True)
class StageTile:
    """A tile pass: each block moves an `across` × `along_k` tile through shared memory, loading along `axis` (the
    source's contiguous dimension: the buffer's row axis, a transposing copy such as a (K, N) weight staged
    K-major, or a batch axis, an operand whose innermost index is a batch axis) and storing along k (the buffer's).

    Its threads take the tile's elements e = threadIdx.x + threads·j in turn (`element_index`), in two orders: `load_lane` runs
    along `axis` fastest (consecutive threads read consecutive source elements), `store_lane` along k fastest
    (consecutive threads write consecutive buffer elements). The shared tile is [along_k][across + 1] (the padding
    word keeps the stores' column reads off one bank)."""

    axis: str
    across: int  # elements along `axis`
    along_k: int  # elements along k

    @property
    def elements(self) -> int:
        return self.across * self.along_k

    def element_index(self, j: Any, thread: Any, threads: int) -> Any:
        """The tile element e that `thread` of `threads` takes at step j (j = 0, 1, … elements / threads − 1)."""
        return j * threads + thread

    def steps(self, threads: int) -> int:
        """The steps each thread takes over the tile."""
        return self.elements // threads

    def load_lane(self, e: Any) -> tuple[Any, Any]:
        """(offset along `axis`, offset along k) within the tile of element e in the load order."""
        return e % self.across, floordiv(e, self.across)

    def store_lane(self, e: Any) -> tuple[Any, Any]:
        """(offset along `axis`, offset along k) within the tile of element e in the store order."""
        return floordiv(e, self.along_k), e % self.along_k

    def slot(self, c: Any, kk: Any) -> Any:
        """The shared tile's slot of the element at offsets (c along `axis`, kk along k)."""
        return kk * (self.across + 1) + c

    @property
    def slots(self) -> int:
        return self.along_k * (self.across + 1)


@dataclass(frozen=True)
class StageLowering:
    """A pre-pass: dst[batch..., row, k] = src at (batch..., row, k) for row < rows, k < K (the gather happens
    here), for every batch of a batched contraction the operand reads (`batch`: those batch axes of
    `habu.lower.batch_axes` and their extents, outermost first: the pass's grid.z, as the batches are the
    contraction's).

    dst's rows are STAGE_ALIGN-rounded, so the contraction can load it with TMA at any #K. The pass writes the
    padding too, zeros (dst is bounded by the padded row, k < K^8, the source read as 0 past #K; the product reads
    the buffer bounded by #K): a main loop reading it in vectors along k (cp.async; a vector's mask is its first
    element's) may then end a vector in the padding, as at K = 511 an 8-element vector from k = 504.

    Without a `tile`, a block copies `threads` consecutive k of one row (thread t the element k0 + t); with one, a
    block moves a tile through shared memory (`StageTile`)."""

    src: Access  # over axes "row" and "k"
    dst: Access  # as the pass writes it: k < K^8 (the padding's zeros)
    rows: str  # extent of the rows
    k: str
    threads: int = 256
    tile: StageTile | None = None
    batch: tuple[tuple[str, str], ...] = ()  # (batch axis, its extent) the operand reads, outermost first

    @property
    def step_k(self) -> int:
        """The elements along k a block covers."""
        return self.tile.along_k if self.tile else self.threads

    @property
    def step_rows(self) -> int:
        """The rows a block covers."""
        return self.tile.across if self.tile and self.tile.axis == self.row_axis else 1

    def grid(self, s: Mapping[str, Any], sm_count: int = 0) -> tuple[Any, Any]:
        """(blocks along k, blocks along the rows)."""
        return cdiv(self.row_length(s), self.step_k), cdiv(s[self.rows], self.step_rows)

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

    def batch_slabs(self) -> tuple[str, ...]:
        """The extents grid.z runs over, outermost first: each batch axis's, a tiled batch axis's in tiles of
        `across` (`E/T`, ⌈#E / T⌉)."""
        return tuple(f"{e}/{self.tile.across}" if self.tile and a == self.tile.axis else e for a, e in self.batch)

    def batches(self, s: Mapping[str, Any]) -> Any:
        """The grid's z: one slab of blocks per batch, or per tile of a tiled batch axis (1 when not batched)."""
        n: Any = 1
        for e in self.batch_slabs():
            n = n * size_of(e, s)
        return n

    def origin(self, bx: Any, by: Any, bz: Any, s: Mapping[str, Any],
               let: Callable[[str, Any], Any] | None = None) -> dict[str, Any]:
        """The coordinates (by axis: the row axis, k, the batch axes) of the first element of block (bx, by, bz);
        grid.z decoded as the contraction decodes its batch index (the last axis fastest)."""
        slabs = self.batch_slabs()
        sizes = {e: size_of(e, s) for e in slabs}
        batch = batch_coordinates(slabs, bz, sizes, let, tuple(a for a, _e in self.batch))
        if self.tile and self.tile.axis in batch:
            batch[self.tile.axis] = batch[self.tile.axis] * self.tile.across
        return {self.row_axis: by * self.step_rows, "k": bx * self.step_k, **batch}

    def element(self, origin: Mapping[str, Any], c: Any, kk: Any) -> dict[str, Any]:
        """The coordinates of the element at offsets (c along the tile's axis, kk along k) from `origin`."""
        out = {**origin, "k": origin["k"] + kk}
        if self.tile:
            out[self.tile.axis] = origin[self.tile.axis] + c
        return out

    def batch_coordinates(self, z: Any, s: Mapping[str, Any], let: Any = None) -> dict[str, Any]:
        """The batch axes' coordinates of the pass's block slab z's first element."""
        o = self.origin(0, 0, z, s, let)
        return {a: o[a] for a, _e in self.batch}


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
    tile = stage_tile(src, axis, kept)
    if tile is not None and tile.axis != axis:  # a tile along a batch axis: the last tile's batches past its extent
        bound = Bound(tile.axis, dict(kept)[tile.axis])
        src, dst = replace(src, masks=(*src.masks, bound)), replace(dst, masks=(*dst.masks, bound))
    return read, StageLowering(src, dst, rows, k, tile=tile, batch=kept)


TRANSPOSE_TILE = 32  # a transposing staging pass moves 32 x 32 tiles (256 threads, 4 elements each)
# an operand whose innermost index is a batch axis: tiles of 8 batches × 128 k (at #S = 8, one contiguous run of
# 2 KB loaded, eight 256-byte runs stored; 256 threads, 4 elements each)
BATCH_TILE = (8, 128)


def stage_tile(src: Access, axis: str, batch: tuple[tuple[str, str], ...]) -> StageTile | None:
    """The tile of a pass whose source is contiguous along the buffer's rows or a batch axis, not along k (None:
    rows along k, the plain pass)."""
    last = src.positions[-1]
    if last.kind != "axis":
        return None
    if last.axis == axis:
        return StageTile(axis, TRANSPOSE_TILE, TRANSPOSE_TILE)
    if last.axis in {a for a, _e in batch}:
        return StageTile(last.axis, *BATCH_TILE)
    return None


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


__all__ = ["BATCH_TILE", "STAGED_VECTOR_BYTES", "STAGE_ALIGN", "TRANSPOSE_TILE", "StageLowering", "StageTile",
           "main_loop_move", "stage_tile", "staged"]
