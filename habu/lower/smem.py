"""Shared-memory layouts of contraction kernels, one per kind of path (`simt_smem`,
`tensor_core_smem`): each path names its own (`PathSupport.smem_layout`, habu/lower/support.py) and
`contraction_smem` there is the one entry the rule checker (sizes, alignment) and the emitter
(offsets) read, so the alignment that is proven is the one that is used.

Buffers: A and B tiles for each pipeline stage, then one mbarrier pair per stage (TMA and
warp-specialised pipelines). A TMA or wgmma tile with a 128-byte swizzle must start at a multiple of
1024 bytes (tilelang #2379); other tiles at 128. Tiles fed to ldmatrix without a swizzle get rows
padded by 16 bytes to spread rows over the 32 banks.
"""

from __future__ import annotations

from dataclasses import dataclass

from habu.lower.registers import consumer_warpgroups
from habu.plan.plan import ContractionKernel
from habu.spec.dtypes import DTYPES


@dataclass(frozen=True)
class Buffer:
    name: str  # "A0", "B0", ..., "bar"
    offset: int  # bytes from the start of dynamic shared memory
    size: int
    align: int  # the alignment the hardware needs of `offset`
    rows: int  # tile rows (0 for barriers)
    row_elems: int  # elements per row, padding included


@dataclass(frozen=True)
class SmemLayout:
    buffers: tuple[Buffer, ...]
    total: int
    a_row: int  # elements per row of an A tile (BK plus padding)
    b_row: int


def tile_alignment(kernel: ContractionKernel, move: str) -> int:
    if kernel.swizzle == 128:
        return 1024
    if kernel.swizzle:
        return 8 * kernel.swizzle
    return 128


EPILOGUE_BOX_BYTES = 64 * 128  # a TMA-store box: 64 output rows of one 128-byte swizzle span


def _round(x: int, a: int) -> int:
    return -(-x // a) * a


def simt_smem(kernel: ContractionKernel, a_dtype: str, b_dtype: str, b_kmajor: bool = True,
              a_kmajor: bool = True) -> SmemLayout:
    """The SIMT path stages one k tile as f32, transposed to [k][row] with one float of padding (either
    operand's storage order: the copies read along its contiguous axis, `habu.lower.layouts.fma_operands`)."""
    a = Buffer("A0", 0, kernel.tile_k * (kernel.tile_m + 1) * 4, 16, kernel.tile_k, kernel.tile_m + 1)
    off = _round(a.size, 16)
    b = Buffer("B0", off, kernel.tile_k * (kernel.tile_n + 1) * 4, 16, kernel.tile_k, kernel.tile_n + 1)
    return SmemLayout((a, b), off + b.size, kernel.tile_m + 1, kernel.tile_n + 1)


def tensor_core_smem(kernel: ContractionKernel, a_dtype: str, b_dtype: str, b_kmajor: bool = True,
                     a_kmajor: bool = True) -> SmemLayout:
    """Tensor-core paths: `stages` A and B tiles (rows padded by 16 bytes for ldmatrix without a
    swizzle), TMA-store boxes per consumer warpgroup, mbarriers. Each operand's tile keeps its global
    contiguity: A [BM][BK] when k-contiguous (`a_kmajor`), else [BK][BM] (read by ldmatrix.trans or the
    wgmma transpose bit); B [BN][BK] or [BK][BN]."""
    ea, eb = DTYPES[a_dtype].bytes, DTYPES[b_dtype].bytes
    pad = 8 if (kernel.mma == "mma.sync" and kernel.swizzle == 0) else 0
    # tiles TMA writes are dense (a box has no padding)
    a_row = (kernel.tile_k if a_kmajor else kernel.tile_m) + (0 if "tma" in kernel.a_move else pad)
    b_row = (kernel.tile_k if b_kmajor else kernel.tile_n) + (0 if "tma" in kernel.b_move else pad)
    a_size = (kernel.tile_m if a_kmajor else kernel.tile_k) * a_row * ea
    b_size = (kernel.tile_n if b_kmajor else kernel.tile_k) * b_row * eb
    align_a = tile_alignment(kernel, kernel.a_move)
    align_b = tile_alignment(kernel, kernel.b_move)
    buffers: list[Buffer] = []
    off = 0
    for s in range(kernel.stages):
        off = _round(off, align_a)
        buffers.append(Buffer(f"A{s}", off, a_size, align_a, kernel.tile_m if a_kmajor else kernel.tile_k, a_row))
        off += a_size
        off = _round(off, align_b)
        buffers.append(Buffer(f"B{s}", off, b_size, align_b, kernel.tile_n if b_kmajor else kernel.tile_k, b_row))
        off += b_size
    if kernel.store == "tma":
        # per consumer warpgroup, two boxes of 64 rows x 128 bytes (128-byte swizzle) that the epilogue
        # fills in turn while TMA stores the other
        for c in range(consumer_warpgroups(kernel.warps, kernel.warp_specialized)):
            for j in range(2):
                off = _round(off, 1024)
                buffers.append(Buffer(f"E{c}.{j}", off, EPILOGUE_BOX_BYTES, 1024, 64, 128))
                off += EPILOGUE_BOX_BYTES
    if "tma" in kernel.a_move or "tma" in kernel.b_move or kernel.warp_specialized:
        off = _round(off, 8)
        buffers.append(Buffer("bar", off, 16 * kernel.stages, 8, 0, 0))
        off += 16 * kernel.stages
    # dynamic shared memory is only 16-byte aligned: the kernel rounds its base up to the largest
    # alignment a tile needs, so the request includes that much slack
    slack = max(b.align for b in buffers) - 16 if max(b.align for b in buffers) > 16 else 0
    return SmemLayout(tuple(buffers), off + slack, a_row, b_row)
