"""The row statistics a fused attention kernel stores for a training forward (`AttentionLowering.stats`,
habu/plan/attention_fused.py): each query row's softmax maximum and sum, after the KV loop, from the lane the
lowering's `stat_writer` names (the first of the row's quad: after the xor shuffles every lane of it holds both).
The kernels keep the maximum in base 2 (the scores times log2 e), so it is stored times `habu::LN2`: a float-only
step, as the base-2 exponentials are; the finite-field check runs the model's units (habu.prove.interp_attention's
`store_statistics`). A row with no visible key stores −∞ and 0, as the model's max and sum of it are."""

from __future__ import annotations

from collections.abc import Mapping

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import access_mask, access_offset, store_value
from habu.lower.attention import AttentionLowering


def statistics_store(lw: AttentionLowering, sig, sizes: Mapping[str, object], it: str, table, row: object,
                     maximum: str, total: str, indent: str) -> str:
    """The stores of the row statistics for the lane's row `row` (a C expression of the row in the query tile)
    whose running maximum and sum are the C values `maximum` and `total` (the sum joined over the row's lanes);
    "" where the kernel keeps none."""
    if lw.stats is None:
        return ""
    coord = {**{a: a for a in lw.batch_axes}, "i": "si"}
    lines = ["{  // the row statistics a training forward keeps: the softmax's maximum and sum of row si",
             f"  const {it} si = ({it})({c(lw.row(CExpr('qt'), row))});",
             f"  if ({c(lw.stat_writer(CExpr('lane')))} && {c(lw.row_inside(CExpr('si'), sizes))}) {{"]
    for access, value in zip(lw.stats, (f"{maximum} * habu::LN2", total), strict=True):
        ptr = sig.pointer(access.tensor, access.dtype, writes=True)
        lines.append(f"    if ({access_mask(access, coord, sizes, table)}) "
                     f"{store_value(access.dtype, ptr, access_offset(access, coord, sizes, lw.index_width, table), value)}")
    lines += ["  }", "}"]
    return "".join(f"{indent}{line}\n" for line in lines)


__all__ = ["statistics_store"]
