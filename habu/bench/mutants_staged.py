"""Planted bugs in a staged operand (`a_move`/`b_move` = staged: a pass copies the rows, gathered, into a buffer
of 16-byte-aligned rows, which wgmma's main loop reads by TMA and mma.sync's by cp.async or ldg, the SIMT path's by ldg). The pass and
the main loop's read of its buffer live in the lowering (habu/lower/staging.py), which the emitter prints and the
finite-field check runs, so each must be killed (habu.bench.mutants lists them)."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import ContractionLowering, Lowering
from habu.lower.access import Access, Position

# GGEMM at Triton #10927's K = 511: the staged rows are padded (512 elements apart), the operands' rows are not
SHAPE = {"M": 300, "N": 200, "K": 511}
BOTH = {"A": "staged", "B": "staged"}  # wgmma, both operands staged
MMA_SYNC = {"mma": "mma.sync", "A": "staged"}  # A's buffer read by the mma.sync main loop (16-byte cp.async vectors)
SIMT = {"mma": "fma", "A": "staged"}  # A's buffer read by the SIMT main loop, an element at a time
# batched products staged by default (session 70): K = 511 over two batch axes, the second a runtime extent
BATCHED = "../tests/data/batched_staged.habu"
BATCHED_SHAPE = {"H": 3}


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
)

__all__ = [
    "MUTANT_ENTRIES",
    "SHAPE",
    "batch_extents_swapped",
    "batch_stride_lost",
    "gather_skipped",
    "main_loop_rows_unpadded",
    "padding_unwritten",
    "rows_unpadded",
    "strided",
    "ungathered",
]
