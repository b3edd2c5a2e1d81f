"""The accumulator layouts of the tensor-core instructions, as the PTX ISA states them, and the check
that an epilogue's fragment map (`habu.lower.fragments`, which the emitters print) agrees with them.

This is the trusted part: a transcription of the ISA's tables, written independently of the
lowering's formulas. mma.m16n8k16 with an f32 C/D ("Matrix fragments for mma.m16n8k16"): groupID =
laneid >> 2, threadID_in_group = laneid % 4; register c_i holds row groupID (i < 2) or groupID + 8
(i >= 2) and column threadID_in_group * 2 + (i & 1). wgmma.m64nNk16 with an f32 D ("Register
fragments: wgmma .m64nNk16 D"): warp w of the warpgroup holds rows 16w .. 16w + 15 with the same
layout, register d_i in column group i >> 2 (8 columns each).
"""

from __future__ import annotations

import numpy as np

from habu.lower.fragments import AccumulatorFragment


def instruction_element(instruction: str, warp: np.ndarray, lane: np.ndarray, reg: np.ndarray):
    """(row, column) of the accumulator element register `reg` of `lane` in `warp` holds."""
    group, in_group = lane >> 2, lane & 3
    if instruction == "mma.sync":
        return group + 8 * ((reg >> 1) & 1), in_group * 2 + (reg & 1)
    if instruction == "wgmma":
        return 16 * warp + group + 8 * ((reg >> 1) & 1), 8 * (reg >> 2) + in_group * 2 + (reg & 1)
    raise ValueError(f"no accumulator layout for {instruction}")


def fragment_mismatch(instruction: str, fragment: AccumulatorFragment, column_groups: int) -> str | None:
    """Run the epilogue's fragment map over every (warp, lane, j, h, q) of one fragment tile and
    compare, register by register, where the epilogue stores it with the element the instruction put
    there; the first disagreement, or None."""
    warps = 4 if instruction == "wgmma" else 1
    groups = column_groups if instruction == "wgmma" else 1
    w, lane, j, h, q = np.meshgrid(np.arange(warps), np.arange(32), np.arange(groups), np.arange(2), np.arange(2),
                                   indexing="ij")
    reg = fragment.register_index(j, h, q) if instruction == "wgmma" else fragment.pair * h + q
    held = instruction_element(instruction, w, lane, reg)
    stored = fragment.element(w, lane, j, h, q) if instruction == "wgmma" else \
        fragment.element(np.zeros_like(w), lane, np.zeros_like(j), h, q)
    bad = (held[0] != stored[0]) | (held[1] != stored[1])
    if not bad.any():
        return None
    i = tuple(int(x[0]) for x in np.nonzero(bad))
    at = (w[i], lane[i], j[i], h[i], q[i])
    return (f"the epilogue stores {instruction} accumulator register {int(reg[i])} of warp {at[0]}, lane {at[1]} "
            f"(j={at[2]}, h={at[3]}, q={at[4]}), which holds tile[{int(held[0][i])}, {int(held[1][i])}] of its "
            f"fragment tile, at tile[{int(stored[0][i])}, {int(stored[1][i])}]")


__all__ = ["fragment_mismatch", "instruction_element"]
