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
    """Run the epilogue's thread decode and fragment map over every (thread, j, h, q) of one fragment tile and
    compare, register by register, where the epilogue stores it with the element the instruction put
    there; the first disagreement, or None."""
    warps = 4 if instruction == "wgmma" else 1
    groups = column_groups if instruction == "wgmma" else 1
    x, j, h, q = np.meshgrid(np.arange(32 * warps), np.arange(groups), np.arange(fragment.halves),
                             np.arange(fragment.pair), indexing="ij")
    # thread x of the warpgroup (of the warp, mma.sync) is lane x % 32 of warp x / 32 (PTX ISA); the
    # epilogue finds its lane and warp with the fragment's thread decode
    w, lane = x // 32, x % 32
    reg = fragment.register_index(j, h, q) if instruction == "wgmma" else fragment.pair * h + q
    held = instruction_element(instruction, w, lane, reg)
    their_lane = fragment.thread_lane(x)
    stored = fragment.element(fragment.thread_warp(x), their_lane, j, h, q) if instruction == "wgmma" else \
        fragment.element(np.zeros_like(x), their_lane, np.zeros_like(j), h, q)
    bad = (held[0] != stored[0]) | (held[1] != stored[1])
    if not bad.any():
        # the accumulator array the epilogue declares: the instruction writes 4 f32 registers per 8-column
        # group (mma.sync m16n8: 4; wgmma m64nN: N/2), and the wrapper's operand list names that many
        declared = fragment.registers(groups)
        if declared != 4 * groups:
            return (f"the epilogue declares {declared} accumulator registers per {instruction} fragment tile, but "
                    f"the instruction writes {4 * groups}")
        return None
    i = tuple(int(x[0]) for x in np.nonzero(bad))
    at = (w[i], lane[i], j[i], h[i], q[i])
    return (f"the epilogue stores {instruction} accumulator register {int(reg[i])} of warp {at[0]}, lane {at[1]} "
            f"(j={at[2]}, h={at[3]}, q={at[4]}), which holds tile[{int(held[0][i])}, {int(held[1][i])}] of its "
            f"fragment tile, at tile[{int(stored[0][i])}, {int(stored[1][i])}]")


# ----------------------------------------------------------------------------- operands (mma.sync)
#
# PTX ISA, "Warp-level matrix load instruction: ldmatrix": .m8n8 loads 8x8 matrices of 16-bit elements;
# for .x1/.x2/.x4, threads 0-7, 8-15, 16-23, 24-31 give the addresses of the 8 rows of matrix 0, 1, 2,
# 3. Register j of each thread receives from matrix j: without .trans, row laneid / 4, elements
# 2·(laneid % 4) and 2·(laneid % 4) + 1 of that row; with .trans, the matrix is transposed: element
# laneid / 4 of rows 2·(laneid % 4) and 2·(laneid % 4) + 1.
#
# PTX ISA, "Matrix fragments for mma.m16n8k16" with .bf16/.f16 operands: groupID = laneid >> 2,
# threadID_in_group = laneid % 4. A (16x16, row): a_i (i = 0..7, two per 32-bit register) holds row
# groupID for i in {0, 1, 4, 5} else groupID + 8, column threadID_in_group·2 + (i & 1) for i < 4
# else + 8. B (16x8, col): b_i (i = 0..3) holds row (k) threadID_in_group·2 + (i & 1) for i < 2
# else + 8, column (n) groupID.


def ldmatrix_elements(row_address: np.ndarray, matrices: int, trans: bool) -> np.ndarray:
    """The shared-memory element each (lane, register, half) receives from ldmatrix, given the element
    address each lane supplied (`row_address[32]`): an array [32, matrices, 2]."""
    lane = np.arange(32)[:, None, None]
    j = np.arange(matrices)[None, :, None]
    half = np.arange(2)[None, None, :]
    if trans:
        return row_address[8 * j + 2 * (lane % 4) + half] + lane // 4
    return row_address[8 * j + lane // 4] + 2 * (lane % 4) + half


def mma_operand_position(operand: str) -> tuple[np.ndarray, np.ndarray]:
    """(row, column) of the m16n8k16 operand (A: m × k; B: k × n) that each (lane, register, half)
    holds: arrays [32, registers, 2]."""
    lane = np.arange(32)[:, None, None]
    group, in_group = lane >> 2, lane % 4
    half = np.arange(2)[None, None, :]
    if operand == "A":
        i = 2 * np.arange(4)[None, :, None] + half  # a_0 .. a_7
        row = group + 8 * ((i >> 1) & 1)
        col = in_group * 2 + (i & 1) + 8 * (i >> 2)
        return row, col
    if operand == "B":
        i = 2 * np.arange(2)[None, :, None] + half  # b_0 .. b_3
        k = in_group * 2 + (i & 1) + 8 * (i >> 1)
        return k, group + 0 * i
    raise ValueError(f"no mma.sync operand {operand}")


# PTX ISA, "Asynchronous Warpgroup Level Matrix Shared Memory Layout" and "Matrix Descriptor Format": a
# K-major operand in a swizzled layout is made of 8-row atoms; row r of the atom lies `span` bytes
# (the swizzle span, 128/64/32) after row r - 1, the atoms lie the stride byte offset (SBO) apart, and
# the k elements of a row are contiguous from the descriptor's start address (the leading byte offset
# is not used while an instruction's k extent, 32 bytes, fits in the span). The hardware applies the
# swizzle to the addresses it forms: bits [4, 4 + log2(span/16)) ^= bits [7, 7 + log2(span/16))
# (CUTLASS Swizzle<B, 4, 3>), from a tile start aligned to the pattern's period.


# The same section, MN-major (the operand read with the transpose bit): an atom is 8 rows along k, each
# one span of MN-contiguous elements (`span` bytes); the atoms lie SBO apart along k and the blocks of
# span/elem_bytes MN elements lie LBO apart along MN; the same swizzle of the addresses formed.


def wgmma_mnmajor_addresses(start: int, mn: int, k: int, lbo: int, sbo: int, span: int, elem_bytes: int = 2
                            ) -> np.ndarray:
    """Byte addresses of an MN-major operand's (mn, k) elements, mn x k, read through a descriptor."""
    if span not in (32, 64, 128):
        raise ValueError(f"no MN-major wgmma layout with swizzle {span}")
    per = span // elem_bytes  # MN elements of one span
    n = np.arange(mn, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    a = start + (n // per) * lbo + (kk // 8) * sbo + (kk % 8) * span + (n % per) * elem_bytes
    return a ^ (((a >> 7) % (span // 16)) << 4)


def wgmma_kmajor_addresses(start: int, rows: int, k: int, sbo: int, span: int, elem_bytes: int = 2) -> np.ndarray:
    """Byte addresses of a K-major operand's (row, k) elements, rows x k, read through a descriptor."""
    if span not in (32, 64, 128):
        raise ValueError(f"no K-major wgmma layout with swizzle {span}")
    r = np.arange(rows, dtype=np.int64)[:, None]
    kk = np.arange(k, dtype=np.int64)[None, :]
    a = start + (r // 8) * sbo + (r % 8) * span + kk * elem_bytes
    return a ^ (((a >> 7) % (span // 16)) << 4)


# CUDA driver API, cuTensorMapEncodeTiled, CUtensorMapSwizzle: a box's innermost dimension is laid out
# contiguously in rows of (inner elements x element size) bytes; with CU_TENSOR_MAP_SWIZZLE_{32,64,128}B
# (the inner dimension at most the span), the 16-byte chunk index within each 128-byte segment is XORed
# with the segment's index mod span/16 (bits [4, 4 + log2(span/16)) ^= bits [7, ...)), from a shared
# memory address aligned to the pattern's period (span x 8 bytes).


def tma_box_bytes(rows: int, cols: int, elem_bytes: int, span: int) -> np.ndarray:
    """Byte offsets, from the box's shared-memory start, of a 2-D TMA box's (row, col) elements (rows x
    cols; cols along the tensor's contiguous dimension) as a TMA load writes them or a TMA store reads
    them."""
    r = np.arange(rows, dtype=np.int64)[:, None]
    col = np.arange(cols, dtype=np.int64)[None, :]
    a = r * cols * elem_bytes + col * elem_bytes
    if span:
        if span not in (32, 64, 128) or cols * elem_bytes > span:
            raise ValueError(f"no TMA box of {cols * elem_bytes}-byte rows with swizzle {span}")
        a = a ^ (((a >> 7) % (span // 16)) << 4)
    return a


__all__ = ["fragment_mismatch", "instruction_element", "ldmatrix_elements", "mma_operand_position",
           "tma_box_bytes", "wgmma_kmajor_addresses", "wgmma_mnmajor_addresses"]
