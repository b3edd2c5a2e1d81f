"""What a lowered kernel stores: the accesses its stores go through (the finite-field check compares and
race-checks each, the emitter's early launch waits for each)."""

from __future__ import annotations

from habu.lower.attention import AttentionLowering
from habu.lower.rows import RowLowering


def stored_accesses(lw: object) -> tuple:
    """Every access a kernel stores through: its output's, a row kernel's stored statistics
    (`RowLowering.stats`: RMSNorm's saved R1[r] beside Y), and a contraction's extra outputs (`extra_outs`:
    the outputs of its epilogue chain before the end, FFN-SKIP's saved S1 beside S3), and a fused attention
    kernel's row statistics (`AttentionLowering.stats`: a training forward's saved maximum and sum)."""
    if isinstance(lw, RowLowering):
        return lw.stores()
    column = getattr(lw, "column_sum", None)  # a column sum in a contraction's epilogue (its bias gradient)
    stats = lw.stats or () if isinstance(lw, AttentionLowering) else ()  # attention's row maximum and sum
    return (*(a for _, a in getattr(lw, "extra_outs", ())), *stats, lw.out,  # type: ignore[attr-defined]
            *((column.out,) if column is not None else ()))


def statistic_box(lw: object, tensor: str, box: tuple) -> tuple:
    """The box of `tensor` where the kernel's output's is `box`: a fused attention kernel's row statistic
    (`AttentionLowering.stats`, M[rows]) has its output's box without the head width d; anything else `box`."""
    if not isinstance(lw, AttentionLowering) or tensor not in {a.tensor for a in lw.stats or ()}:
        return box
    return tuple(b for b, p in zip(box, lw.out.positions, strict=False) if p.axis != "d")


__all__ = ["statistic_box", "stored_accesses"]
