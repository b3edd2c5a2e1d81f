"""Planted bugs in the store of a row statistic a row kernel saves beside its row (RMSNorm's forward with
the rstd its backward reads: one kernel stores R1[r] and Y[r d], `RowLowering.stats`). The finite-field
check stores the statistic from the thread the lowering names, at the offset the lowering computes, and
compares R1 as an output, so each must be killed (habu.bench.mutants lists them). Their model is the
forward `habu.spec.grad_program.derive_model` gives (`RMSNORM-ROWS:forward`: `Mutant.load_model`)."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import Lowering, RowLowering
from habu.lower.access import Position
from habu.lower.rows import with_kept_rows

MODEL = "RMSNORM-ROWS:forward"
SHAPE = {"R": 8, "D": 1000}  # a warp per row, four rows a block, a ragged last chunk


def statistic_at_first_row(lw: Lowering) -> Lowering:
    """Every row stores its rstd at R1[0]: the statistic's row position dropped (a constant index)."""
    assert isinstance(lw, RowLowering)
    return replace(lw, stats=tuple(replace(st, out=replace(st.out, positions=(Position("const"),)))
                                   for st in lw.stats))


def statistic_with_row_stride(lw: Lowering) -> Lowering:
    """The statistic stored at r·#D, the row's offset in Y (its stride copied from the output's)."""
    assert isinstance(lw, RowLowering)
    return replace(lw, stats=tuple(replace(st, out=replace(st.out, strides=((lw.c,),))) for st in lw.stats))


def statistic_never_stored(lw: Lowering) -> Lowering:
    """The store is guarded by `tid == threads` (the row's last lane, off by one): no thread stores it."""
    assert isinstance(lw, RowLowering)
    return replace(lw, stats=tuple(replace(st, lane=lw.thread_map.threads) for st in lw.stats))


def statistic_dropped(lw: Lowering) -> Lowering:
    """The kernel computes R1 (the plan's node) but its lowering stores only Y: the check compares what the
    plan's kernels compute, not what their lowerings store."""
    assert isinstance(lw, RowLowering)
    return replace(lw, stats=())


GATHER_EXAMPLE = "../tests/data/row_gather.habu"  # relative to examples/, as habu.bench.mutants reads them


def gathered_row_read_plainly(lw: Lowering) -> Lowering:
    """The row read through IX (`A[IX[r] d]`) read at row r itself: the gather dropped from its position."""
    assert isinstance(lw, RowLowering)
    loads = tuple((ld, replace(acc, positions=tuple(Position("axis", p.axis) if p.kind == "gather" else p
                                                    for p in acc.positions), checks=()))
                  for ld, acc in lw.loads)
    return with_kept_rows(replace(lw, loads=loads))


MUTANT_ENTRIES = (
    ("rows-saved-statistic-at-first-row", "a row kernel saving RMSNorm's rstd stores every row's at R1[0] (the "
     "statistic's row index dropped)", "rmsnorm.habu", MODEL, SHAPE, statistic_at_first_row),
    ("rows-saved-statistic-row-stride", "a row kernel saving RMSNorm's rstd stores R1[r] at r·#D, the row's "
     "offset in Y", "rmsnorm.habu", MODEL, SHAPE, statistic_with_row_stride),
    ("rows-saved-statistic-never-stored", "a row kernel saving RMSNorm's rstd guards its store by tid == "
     "threads: no thread stores R1", "rmsnorm.habu", MODEL, SHAPE, statistic_never_stored),
    ("rows-saved-statistic-dropped", "a row kernel computing RMSNorm's R1 and Y stores only Y", "rmsnorm.habu",
     MODEL, SHAPE, statistic_dropped),
    ("rows-gathered-row-read-plainly", "a row kernel reading row IX[r] of A reads row r", GATHER_EXAMPLE, "ROW-DOT",
     {}, gathered_row_read_plainly),
)

__all__ = ["MUTANT_ENTRIES", "gathered_row_read_plainly", "statistic_at_first_row", "statistic_dropped", "statistic_never_stored", "statistic_with_row_stride"]
