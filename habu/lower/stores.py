"""What a lowered kernel stores: the accesses its stores go through (the finite-field check compares and
race-checks each, the emitter's early launch waits for each)."""

from __future__ import annotations

from habu.lower.rows import RowLowering


def stored_accesses(lw: object) -> tuple:
    """Every access a kernel stores through: its output's, a row kernel's stored statistics
    (`RowLowering.stats`: RMSNorm's saved R1[r] beside Y), and a contraction's extra outputs (`extra_outs`:
    the outputs of its epilogue chain before the end, FFN-SKIP's saved S1 beside S3)."""
    if isinstance(lw, RowLowering):
        return lw.stores()
    column = getattr(lw, "column_sum", None)  # a column sum in a contraction's epilogue (its bias gradient)
    return (*(a for _, a in getattr(lw, "extra_outs", ())), lw.out,  # type: ignore[attr-defined]
            *((column.out,) if column is not None else ()))


__all__ = ["stored_accesses"]
