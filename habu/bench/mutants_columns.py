"""Planted bugs in a column kernel that stores a bias gradient in the bias's broadcast shape (`dB[one n] = Σ r
dY[r n]`: the column kernel's epilogue stores at row 0, habu/plan/patterns.py `epilogue_column`). The emitter
prints the store's offset from the lowering's access, and the finite-field check writes through the same one."""

from __future__ import annotations

from dataclasses import replace

from habu.bench.mutants_column_epilogue import MUTANT_ENTRIES as COLUMN_SUM_ENTRIES
from habu.lower import ColumnLowering, Lowering

EXAMPLE = "../tests/data/bias_add.habu"  # relative to examples/, as habu.bench.mutants reads them
MODEL = "BIAS-ADD:backward"


def broadcast_row_one(lw: Lowering) -> Lowering:
    """The bias gradient stored at row 1 of its (1, N) shape: the constant row of its broadcast position off by one."""
    assert isinstance(lw, ColumnLowering)
    positions = tuple(replace(p, value=1) if p.kind == "const" else p for p in lw.out.positions)
    return replace(lw, out=replace(lw.out, positions=positions))


MUTANT_ENTRIES = (
    ("columns-broadcast-row-one", "a bias gradient stored in its (1, N) shape at row 1, not 0", EXAMPLE, MODEL, {},
     broadcast_row_one, None, 1),
    *COLUMN_SUM_ENTRIES,  # a column sum in a contraction's epilogue (mutants_column_epilogue.py)
)

__all__ = ["MUTANT_ENTRIES", "broadcast_row_one"]
