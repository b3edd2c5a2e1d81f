"""Planted bugs in a staged operand (`a_move`/`b_move` = staged: a pass copies the rows, gathered, into a buffer
of 16-byte-aligned rows, which wgmma's main loop reads by TMA and mma.sync's by cp.async or ldg, the SIMT path's by ldg). The pass and
the main loop's read of its buffer live in the lowering (habu/lower/staging.py), which the emitter prints and the
finite-field check runs, so each must be killed (habu.bench.mutants lists them)."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import ContractionLowering, Lowering
from habu.lower.access import Access, Position, floordiv
from habu.lower.staging import StageLowering, StageTile

# GGEMM at Triton #10927's K = 511: the staged rows are padded (512 elements apart), the operands' rows are not
SHAPE = {"M": 300, "N": 200, "K": 511}
BOTH = {"A": "staged", "B": "staged"}  # wgmma, both operands staged
MMA_SYNC = {"mma": "mma.sync", "A": "staged"}  # A's buffer read by the mma.sync main loop (16-byte cp.async vectors)
SIMT = {"mma": "fma", "A": "staged"}  # A's buffer read by the SIMT main loop, an element at a time
# batched products staged by default (session 70): K = 511 over two batch axes, the second a runtime extent
BATCHED = "../tests/data/batched_staged.habu"
BATCHED_SHAPE = {"H": 3}
# an operand whose innermost index is the batch axis, #S = 13: two (batch, k) tiles of 8 batches, the second ragged
INNERMOST_SHAPE = {"S": 13}


def strided(acc: Access, pos: int, extents: tuple[str, ...]) -> Access:
    """`acc` with position `pos`'s stride the product of `extents`."""
    strides = list(acc.strides)
    strides[pos] = extents
    return replace(acc, strides=tuple(strides))


def ungathered(acc: Access) -> Access:
    """`acc` with its gathered positions read at the index itself (`A[m]` for `A[IX[m]]`)."""
    return replace(acc, positions=tuple(Position("axis", p.axis) if p.kind == "gather" else p for p in acc.positions))


def _staged(lw: Lowering) -> ContractionLowering:
    assert isinstance(lw, ContractionLowering) and lw.pre
    return lw


def gather_skipped(lw: Lowering) -> Lowering:
    lw = _staged(lw)
    return replace(lw, pre=(replace(lw.pre[0], src=ungathered(lw.pre[0].src)), *lw.pre[1:]))


def rows_unpadded(lw: Lowering) -> Lowering:
    lw = _staged(lw)
    return replace(lw, pre=(replace(lw.pre[0], dst=strided(lw.pre[0].dst, 0, ("K",))), *lw.pre[1:]))


def main_loop_rows_unpadded(lw: Lowering) -> Lowering:
    lw = _staged(lw)
    return replace(lw, a=strided(lw.a, 0, ("K",)))


def padding_unwritten(lw: Lowering) -> Lowering:
    """The pass writes k < #K only: at K = 511 the main loop's 8-element vector from k = 504 reads an element of
    padding no kernel wrote (a vector's mask is its first element's)."""
    lw = _staged(lw)
    stage = lw.pre[0]
    return replace(lw, pre=(replace(stage, dst=replace(stage.dst, masks=lw.a.masks)), *lw.pre[1:]))


def batch_stride_lost(lw: Lowering) -> Lowering:
    lw = _staged(lw)
    return replace(lw, pre=(replace(lw.pre[0], dst=strided(lw.pre[0].dst, 0, ())), *lw.pre[1:]))


def batch_extents_swapped(lw: Lowering) -> Lowering:
    """The pass's grid.z decoded as if its two batch extents were each other's (#G = 2 and #H = 3: some batches
    never copied, others out of bounds)."""
    lw = _staged(lw)
    stage = lw.pre[0]
    (a0, e0), (a1, e1) = stage.batch
    return replace(lw, pre=(replace(stage, batch=((a0, e1), (a1, e0))), *lw.pre[1:]))


class _StoresTransposed(StageTile):
    """A tile whose stores take the element at (offset e % along_k along the tile's axis, e / along_k along k): the
    roles of the two offsets swapped against the loads'."""

    def store_lane(self, e):
        return e % self.along_k, floordiv(e, self.along_k)


class _StepsOverlap(StageTile):
    """A tile whose threads step over it half a block at a time: step j + 1 retakes half of step j's elements, and
    the tile's last half-block is never taken."""

    def element_index(self, j, thread, threads):
        return j * (threads // 2) + thread


def _planted_tile(lw: Lowering, planted: type[StageTile]) -> Lowering:
    """The first staging pass's tile, of the same shape, with the planted class's maps."""
    lw = _staged(lw)
    stage = lw.pre[0]
    assert stage.tile is not None
    tile = planted(stage.tile.axis, stage.tile.across, stage.tile.along_k)
    return replace(lw, pre=(replace(stage, tile=tile), *lw.pre[1:]))


def tile_steps_overlap(lw: Lowering) -> Lowering:
    return _planted_tile(lw, _StepsOverlap)


def tile_stores_transposed(lw: Lowering) -> Lowering:
    return _planted_tile(lw, _StoresTransposed)


def batch_tile_unmasked(lw: Lowering) -> Lowering:
    """The (batch, k) tile pass without its bound on the batch axis: the last tile's batches past #S are read
    and written."""
    lw = _staged(lw)
    stage = lw.pre[0]
    assert stage.tile is not None
    unmasked = {"src": stage.src, "dst": stage.dst}
    for side, acc in unmasked.items():
        unmasked[side] = replace(acc, masks=tuple(b for b in acc.masks if b.axis != stage.tile.axis))
    return replace(lw, pre=(replace(stage, **unmasked), *lw.pre[1:]))


class _SlabsUnscaled(StageLowering):
    """grid.z's tiles of the batch axis read as batches: slab z starts at batch z, not z · across."""

    def origin(self, bx, by, bz, s, let=None):
        o = super().origin(bx, by, bz, s, let)
        o[self.tile.axis] = floordiv(o[self.tile.axis], self.tile.across)
        return o


def batch_slabs_unscaled(lw: Lowering) -> Lowering:
    lw = _staged(lw)
    stage = lw.pre[0]
    fields = {f: getattr(stage, f) for f in stage.__dataclass_fields__}
    return replace(lw, pre=(_SlabsUnscaled(**fields), *lw.pre[1:]))


MUTANT_ENTRIES = (
    ("stage-gather-skipped", "the staging pass copies A[m] instead of A[IX[m]]", "ggemm.habu", "GGEMM", SHAPE,
     gather_skipped, BOTH),
    ("stage-rows-unpadded", "the staging pass writes rows #K apart; the GEMM reads them #K^8 apart", "ggemm.habu",
     "GGEMM", SHAPE, rows_unpadded, BOTH),
    ("mma-sync-staged-rows-unpadded", "the mma.sync main loop reads the staged A's rows #K apart; its pass writes "
     "them #K^8 apart", "ggemm.habu", "GGEMM", SHAPE, main_loop_rows_unpadded, MMA_SYNC),
    ("simt-staged-rows-unpadded", "the SIMT main loop reads the staged A's rows #K apart; its pass writes them #K^8 "
     "apart", "ggemm.habu", "GGEMM", SHAPE, main_loop_rows_unpadded, SIMT),
    ("stage-padding-unwritten", "the staging pass leaves its rows' padding past #K unwritten; the mma.sync main loop's "
     "16-byte cp.async vectors read into it at K = 511", "ggemm.habu", "GGEMM", SHAPE, padding_unwritten, MMA_SYNC),
    ("stage-batch-stride-lost", "a batched staging pass writes every batch's rows over the first batch's (its "
     "buffer's outer stride 1)", BATCHED, "TWO-BATCHES-RUNTIME", BATCHED_SHAPE, batch_stride_lost, None),
    ("stage-batch-extents-swapped", "a batched staging pass decodes its grid.z with the two batch extents swapped",
     BATCHED, "TWO-BATCHES-RUNTIME", BATCHED_SHAPE, batch_extents_swapped, None),
    ("stage-tile-stores-transposed", "the (batch, k) tile pass stores each element from the shared slot of the "
     "element with its two offsets swapped", BATCHED, "BATCH-INNERMOST", INNERMOST_SHAPE, tile_stores_transposed,
     None),
    ("stage-tile-steps-overlap", "the (batch, k) tile pass's threads step half a block at a time: the tile's last "
     "128 elements are never copied", BATCHED, "BATCH-INNERMOST", INNERMOST_SHAPE, tile_steps_overlap, None),
    ("stage-batch-tile-unmasked", "the (batch, k) tile pass has no bound on the batch axis: at #S = 13 the second "
     "tile reads and writes batches 13..15", BATCHED, "BATCH-INNERMOST", INNERMOST_SHAPE, batch_tile_unmasked, None),
    ("stage-batch-slabs-unscaled", "the (batch, k) tile pass starts grid.z's slab z at batch z instead of 8z: "
     "batches 9..12 are never copied", BATCHED, "BATCH-INNERMOST", INNERMOST_SHAPE, batch_slabs_unscaled, None),
)

__all__ = [
    "MUTANT_ENTRIES",
    "SHAPE",
    "batch_extents_swapped",
    "batch_slabs_unscaled",
    "batch_stride_lost",
    "batch_tile_unmasked",
    "gather_skipped",
    "main_loop_rows_unpadded",
    "padding_unwritten",
    "rows_unpadded",
    "strided",
    "tile_steps_overlap",
    "tile_stores_transposed",
    "ungathered",
]
