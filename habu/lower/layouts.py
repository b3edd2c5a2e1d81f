"""Shared-memory tile layouts and the maps in and out of them, as index expressions.

A contraction stages each k tile of an operand in shared memory (`SmemTile`): which thread copies which
elements there (`StageCopy`, the store side), where each lane of a warp points ldmatrix (`LdmatrixRead`,
the read side), and which part of the tile each warp multiplies (`WarpGrid`). Every map is written
once, over generic integer arithmetic (+, *, //, %, ^): the emitters evaluate it on `CExpr`s and print
the C (`habu.emit_cuda.cexpr`), the finite-field interpreter evaluates it on numpy arrays
(`habu.prove.smem_route`): it writes each stage tile through the store map, reads it back through the
read map into the instruction's operand registers as the PTX ISA lays them out, and feeds the mma from
them. A wrong swizzle, row stride, lane map or warp origin changes the finite-field result.

    byte offset of (row, col) = swizzle((row * row_elems + col) * elem_bytes)
    swizzle(b) = b ^ (((b / 128) % (span / 16)) * 16)      span = 32, 64, 128 bytes (0: none)

The swizzle is CUTLASS's Swizzle<log2(span/16), 4, 3> and what TMA's CU_TENSOR_MAP_SWIZZLE_{32,64,128}B
write: the 16-byte chunk index within each 128-byte row segment XOR the segment's index mod span/16
(tiles start at multiples of the pattern's period, `habu.lower.smem.tile_alignment`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from habu.lower.access import Access
from habu.lower.fragments import A_OPERAND, B_OPERAND, OperandFragment
from habu.lower.registers import consumer_warpgroups
from habu.lower.smem import Buffer, simt_smem, tensor_core_smem
from habu.lower.staging import main_loop_move
from habu.plan.plan import ContractionKernel
from habu.spec.dtypes import DTYPES


@dataclass(frozen=True)
class SmemTile:
    """One operand's stage tile: `rows` rows of `row_elems` elements (padding included) of
    `elem_bytes` bytes. `k_rows`: a row runs along the operand's m/n and rows follow k (B staged
    [k][n]); otherwise a row is one m/n index, contiguous along k."""

    rows: int
    row_elems: int
    elem_bytes: int
    swizzle: int = 0  # 0, 32, 64 or 128 bytes
    k_rows: bool = False
    # k-row tiles kept as blocks of `block_cols` m/n columns, each `block_rows` (the k tile) rows, one
    # after another (an MN-major wgmma operand: one 64-column TMA box per block); 0: one block.
    # K-major tiles (k_rows False) kept as blocks of `block_cols` k columns (one 128-byte swizzle span),
    # each `block_rows` (the tile's m/n rows) rows, one after another (a wgmma k tile longer than one
    # span: one TMA box per block along k)
    block_cols: int = 0
    block_rows: int = 0

    @property
    def bytes(self) -> int:
        return self.rows * self.row_elems * self.elem_bytes

    def storage(self, mn: Any, k: Any) -> tuple[Any, Any]:
        """(row, column) of the tile where the operand's element (mn, k) of this k tile is kept."""
        if self.k_rows and self.block_cols:
            return (mn // self.block_cols) * self.block_rows + k, mn % self.block_cols
        if self.block_cols:  # K-major blocks along k
            return (k // self.block_cols) * self.block_rows + mn, k % self.block_cols
        return (k, mn) if self.k_rows else (mn, k)

    def index(self, row: Any, *col: Any) -> Any:
        """The element index of (row, col) in an unswizzled tile; the column may come as terms, added
        in turn (as C would print them)."""
        b = row * self.row_elems
        for term in col:
            b = b + term
        return b

    def index_of(self, mn: tuple[Any, ...], k: tuple[Any, ...]) -> Any:
        """The element index of the operand's (sum of mn terms, sum of k terms), in storage order."""
        row_terms, col_terms = (k, mn) if self.k_rows else (mn, k)
        row = row_terms[0]
        for term in row_terms[1:]:
            row = row + term
        return self.index(row, *col_terms)

    def linear_offset(self, row: Any, *col: Any) -> Any:
        """The byte offset of (row, col) before the swizzle (what a wgmma descriptor's start address
        holds: the hardware swizzles the addresses it forms)."""
        return self.index(row, *col) * self.elem_bytes

    def byte_offset(self, row: Any, *col: Any) -> Any:
        """The byte offset of (row, col) from the tile's start (ints, numpy arrays or CExprs), swizzled."""
        if self.swizzle and self.row_elems * self.elem_bytes == self.swizzle and len(col) == 1:
            # rows exactly one span long (wgmma/TMA tiles): the same XOR, written per row and chunk
            # (row % (span/16) is the span index mod span/16 here); compiles to shifts and masks
            byte = col[0] * self.elem_bytes
            chunk = (byte // 16) ^ (row % (self.swizzle // 16))
            return row * self.swizzle + chunk * 16 + byte % 16
        b = self.index(row, *col) * self.elem_bytes
        if self.swizzle:
            b = b ^ (((b // 128) % (self.swizzle // 16)) * 16)
        return b


@dataclass(frozen=True)
class StageCopy:
    """The store side: a block's threads copy a k tile into its stage tile `vector` elements at a time,
    copy e = thread, thread + threads, ... taking the elements at `element(e)` and the next vector - 1
    along the operand's contiguous dimension (`k_inner`: k; else m/n), written as contiguous bytes."""

    inner: int  # elements along the contiguous dimension
    outer: int
    vector: int
    k_inner: bool
    tile: SmemTile  # the layout the copies write (the stage tile's own: printed from here)

    @property
    def count(self) -> int:
        return self.inner * self.outer // self.vector

    def along(self, e: Any) -> tuple[Any, Any]:
        """(outer, inner) index of copy e's first element."""
        per = self.inner // self.vector
        return e // per, (e % per) * self.vector

    def element(self, outer: Any, inner: Any) -> tuple[Any, Any]:
        """The operand's (mn, k) at (outer, inner)."""
        return (outer, inner) if self.k_inner else (inner, outer)

    def byte_offset(self, mn: Any, k: Any) -> Any:
        """Where in the stage tile the copy of the operand's (mn, k) writes."""
        return self.tile.byte_offset(*self.tile.storage(mn, k))

    def index(self, mn: Any, k: Any) -> Any:
        """The element index the copy of the operand's (mn, k) writes (unswizzled tiles)."""
        return self.tile.index(*self.tile.storage(mn, k))


@dataclass(frozen=True)
class LdmatrixRead:
    """The read side: `ldmatrix.m8n8.x{matrices}{.trans}` with lane l pointing at the fragment's row
    l % row_lanes + (l / (row_lanes · col_groups)) · row_lanes (of storage rows; the second term only
    where `row_blocks` > 1) and column ((l / row_lanes) % col_groups) · col_step. The shape comes from
    the operand's register placement (`habu.lower.fragments.OperandFragment.read_shape`)."""

    matrices: int  # 4 or 2
    trans: bool
    row_lanes: int
    col_groups: int
    tile: SmemTile  # the layout the reads assume (the stage tile's own: printed from here)
    col_step: int = 8
    # blocks of row_lanes rows one below the other, taken after the col_groups columns (an A stored
    # [k][m], read by ldmatrix.x4.trans: k rows 0-7 for matrices 0, 1; k rows 8-15 for matrices 2, 3)
    row_blocks: int = 1

    def lane_offset(self, lane: Any) -> tuple[Any, Any]:
        row = lane % self.row_lanes
        if self.row_blocks > 1:
            row = row + (lane // (self.row_lanes * self.col_groups)) * self.row_lanes
        if self.col_groups == 1:
            return row, 0
        group = lane // self.row_lanes
        if self.row_lanes * self.col_groups != 32:  # (lanes are 0..31: no wrap needed where they fill the groups)
            group = group % self.col_groups
        return row, group * self.col_step


@dataclass(frozen=True)
class WarpGrid:
    """Warps over the output tile: warp w takes rows warp_m(w)·warp_rows... and columns warp_n(w)·warp_cols...
    (the ldmatrix reads and the epilogue print the same origins)."""

    along_m: int
    warp_rows: int
    warp_cols: int

    def warp_m(self, warp: Any) -> Any:
        return warp % self.along_m

    def warp_n(self, warp: Any) -> Any:
        return warp // self.along_m

    def row_origin(self, wm: Any) -> Any:
        return wm * self.warp_rows

    def col_origin(self, wn: Any) -> Any:
        return wn * self.warp_cols


@dataclass(frozen=True)
class MmaSyncOperands:
    """The mma.sync m16n8k16 path's shared-memory operands: per operand the stage tile (the buffer
    `habu.lower.smem` sizes), how threads fill it, how ldmatrix reads it, and the warp grid. The copy
    and the read each carry the layout they print: the lowering gives both the buffer's, and the
    finite-field check runs them against each other."""

    warps: int
    grid: WarpGrid
    a_tile: SmemTile
    b_tile: SmemTile
    a_copy: StageCopy
    b_copy: StageCopy
    a_read: LdmatrixRead
    b_read: LdmatrixRead
    bk: int

    def a_fragment(self, wm: Any, mi: Any, ks: Any, lane: Any) -> Any:
        """Byte offset in A's tile of the row `lane` gives ldmatrix for m16 tile mi, k step ks."""
        return _fragment(self.a_read, (self.grid.row_origin(wm), mi * 16), ks * 16, lane)

    def b_fragment(self, wn: Any, ni: Any, ks: Any, lane: Any) -> Any:
        """Byte offset in B's tile of the row `lane` gives ldmatrix for n8 tile ni, k step ks."""
        return _fragment(self.b_read, (self.grid.col_origin(wn), ni * 8), ks * 16, lane)


def _fragment(read: LdmatrixRead, mn: tuple[Any, ...], k: Any, lane: Any) -> Any:
    """The byte offset lane `lane` points ldmatrix at: the fragment's origin (mn terms, k) in storage
    order, plus the lane's row and column."""
    r, c = read.lane_offset(lane)
    row_terms, cols = ((k,), mn) if read.tile.k_rows else (mn, (k,))
    row = row_terms[0]
    for term in row_terms[1:]:
        row = row + term
    return read.tile.byte_offset(row + r, *cols, c)



@dataclass(frozen=True)
class ThreadGrid:
    """The SIMT path's threads over the output tile: thread t is (tx, ty) = (t % across, t / across) and
    computes rows ty + i·down (i < per_thread_m) and columns tx + j·across (j < per_thread_n)."""

    across: int
    down: int
    per_thread_m: int
    per_thread_n: int

    def tx(self, t: Any) -> Any:
        return t % self.across

    def ty(self, t: Any) -> Any:
        return t // self.across

    def row_terms(self, ty: Any, i: Any) -> tuple[Any, Any]:
        return ty, i * self.down

    def col_terms(self, tx: Any, j: Any) -> tuple[Any, Any]:
        return tx, j * self.across


@dataclass(frozen=True)
class FmaOperands:
    """The SIMT path's shared-memory operands: f32 stage tiles transposed to [k][row] with one float
    of padding, the copies that fill them (one element each, converted to f32), and the thread grid
    whose reads (a[i] = sA at (k, row ty + i·down)) and epilogue print the same rows and columns.
    `a_read`/`b_read`: the layout the reads assume. The emitter prints every bound of the kernel's
    loops from here: the copies' count and thread stride (`threads`), the k loop (`bk`), each thread's
    TM x TN register tile (`grid.per_thread_m`, `per_thread_n`), and where each tile starts in shared
    memory (`a_offset`, `b_offset`, bytes)."""

    threads: int
    grid: ThreadGrid
    a_tile: SmemTile
    b_tile: SmemTile
    a_copy: StageCopy
    b_copy: StageCopy
    a_read: SmemTile
    b_read: SmemTile
    bk: int
    a_offset: int = 0
    b_offset: int = 0

    def a_index(self, k: Any, ty: Any, i: Any) -> Any:
        """The element of A's stage tile thread row ty reads for its i-th row at instruction k."""
        return self.a_read.index_of(self.grid.row_terms(ty, i), (k,))

    def b_index(self, k: Any, tx: Any, j: Any) -> Any:
        return self.b_read.index_of(self.grid.col_terms(tx, j), (k,))


def fma_operands(kernel: ContractionKernel, a: Access, b: Access, buffers: dict[str, Buffer],
                 grid: tuple[int, int, int, int] | None) -> FmaOperands | None:
    """The SIMT path's maps (`grid`: its thread grid, `fma_thread_grid`), or None where the tile does
    not divide over the threads."""
    if grid is None:
        return None
    tx, ty, tn, tm = grid
    a_tile = tile_of_buffer(buffers["A0"], 4, 0, True)
    b_tile = tile_of_buffer(buffers["B0"], 4, 0, True)

    def copy(access: Access, rows: int, tile: SmemTile) -> StageCopy:
        k_fast = access.positions[-1].axis == "k"  # consecutive threads touch consecutive addresses
        return StageCopy(kernel.tile_k, rows, 1, True, tile) if k_fast else StageCopy(rows, kernel.tile_k, 1, False, tile)

    return FmaOperands(32 * kernel.warps, ThreadGrid(tx, ty, tm, tn), a_tile, b_tile,
                       copy(a, kernel.tile_m, a_tile), copy(b, kernel.tile_n, b_tile), a_tile, b_tile, kernel.tile_k,
                       buffers["A0"].offset, buffers["B0"].offset)


SWIZZLE_MODE = {0: 0, 128: 1, 64: 2, 32: 3}  # a wgmma descriptor's bits 62-63 (PTX ISA, "Matrix Descriptor")


@dataclass(frozen=True)
class WgmmaDescriptor:
    """The layout fields of a wgmma shared-memory matrix descriptor of a K-major operand: leading and
    stride byte offsets and the swizzle span (the start address is `WgmmaOperands.a_start`/`b_start`)."""

    lbo: int
    sbo: int
    swizzle: int
    # MN-major (read with the transpose bit): LBO steps between blocks of span/elem columns, SBO between
    # 8-row (k) atoms, the k rows `span` bytes apart
    mn_major: bool = False

    @property
    def mode(self) -> int:
        return SWIZZLE_MODE[self.swizzle]


@dataclass(frozen=True)
class WgmmaOperands:
    """The wgmma path's shared-memory operands (K-major, or MN-major in 64-column blocks): per operand
    the stage tile (rows of 128 bytes in the 128-byte swizzle), how the producer fills it (a TMA box of 16-byte chunks placed by the tensor
    map's swizzle, or the producer threads' cp.async/ldg copies), and the descriptors the consumers
    read it with. Consumer warpgroup cw's slab s covers rows (cw·slabs + s)·64 of the tile. Stage s's
    tiles start `a_offset + s·stage_stride` and `b_offset + s·stage_stride` bytes from the aligned shared
    memory base; a k tile is bk / 16 wgmma k steps."""

    consumers: int
    slabs: int
    a_tile: SmemTile
    b_tile: SmemTile
    a_copy: StageCopy
    b_copy: StageCopy
    a_desc: WgmmaDescriptor
    b_desc: WgmmaDescriptor
    bk: int
    stages: int = 1
    a_offset: int = 0
    b_offset: int = 0
    stage_stride: int = 0
    base_align: int = 1024  # the kernel rounds its shared-memory base up to this (the offsets count from it)

    def stage_tile(self, side: str, stage: Any) -> Any:
        """Bytes from the aligned shared-memory base to stage `stage`'s tile of operand `side`."""
        return (self.a_offset if side == "A" else self.b_offset) + stage * self.stage_stride

    @property
    def k_steps(self) -> int:
        return self.bk // 16

    def slab_row(self, cw: Any, s: Any) -> Any:
        return (cw * self.slabs + s) * 64

    def a_start(self, cw: Any, s: Any, kk: Any) -> tuple[Any, Any]:
        """The descriptor start (bytes from the stage's A tile) of slab s of warpgroup cw, k step kk,
        as (row part, k part): their sum. MN-major (A stored [k m]): the slab's 64 rows are one block
        of the tile's 64-column blocks, a k step 16 rows of it. K-major in blocks along k: k step kk
        is 16 columns of block kk / (span / 32)."""
        t = self.a_tile
        if t.k_rows:
            return t.linear_offset(*t.storage(self.slab_row(cw, s), 0)), kk * 16 * t.row_elems * t.elem_bytes
        if t.block_cols:
            return t.linear_offset(self.slab_row(cw, s)), _kmajor_block_start(t, kk)
        return t.linear_offset(self.slab_row(cw, s)), kk * 16 * t.elem_bytes

    def b_start(self, kk: Any) -> tuple[Any, Any]:
        if self.b_tile.k_rows:  # MN-major: a k step is 16 rows of the tile
            return 0, kk * 16 * self.b_tile.row_elems * self.b_tile.elem_bytes
        if self.b_tile.block_cols:
            return self.b_tile.linear_offset(0), _kmajor_block_start(self.b_tile, kk)
        return self.b_tile.linear_offset(0), kk * 16 * self.b_tile.elem_bytes

    @property
    def bn(self) -> int:
        return self.b_copy.outer if self.b_copy.k_inner else self.b_copy.inner

    @property
    def bm(self) -> int:
        return self.a_copy.outer if self.a_copy.k_inner else self.a_copy.inner


def _kmajor_block_start(tile: SmemTile, kk: Any) -> Any:
    """The bytes from a K-major blocked tile's start to k step kk (16 columns) of its first row: the
    block holding the step (block_rows rows of one span each), then the step within the block."""
    steps = tile.block_cols // 16  # k steps per block
    return (kk // steps) * (tile.block_rows * tile.row_elems * tile.elem_bytes) + (kk % steps) * 16 * tile.elem_bytes


WGMMA_K_SPANS = (1, 2, 4)  # k tiles of 1, 2 or 4 swizzle spans (64, 128, 256 16-bit columns)


def wgmma_operands(kernel: ContractionKernel, a: Access, b: Access, buffers: dict[str, Buffer],
                   consumers: int) -> WgmmaOperands | None:
    """The wgmma path's maps for K-major operands, or MN-major ones (B stored [k n], A stored [k m])
    loaded by TMA in blocks of one 128-byte span of columns (64 16-bit elements) by the k tile, read with
    the transpose bit (an MN-major A's 64-row slab is one block)."""
    e = DTYPES[a.dtype].bytes
    b_mn = b.positions[-1].axis != "k"
    a_mn = a.positions[-1].axis != "k"
    if (kernel.tile_k * e not in tuple(128 * n for n in WGMMA_K_SPANS)
            or kernel.swizzle != 128 or consumers < 1 or kernel.tile_m % (64 * consumers) or a.dtype != b.dtype):
        return None
    span_cols = kernel.swizzle // e
    k_blocks = kernel.tile_k // span_cols  # K-major tiles longer than a span: blocks along k
    if b_mn and (kernel.b_move != "tma" or kernel.tile_n % span_cols):
        return None
    if a_mn and (kernel.a_move != "tma" or span_cols != 64):
        return None

    def blocks(cols: int, buffer: Buffer) -> SmemTile | None:
        # an MN-major stage tile: cols / 64 boxes of [tile_k][64], one after another (rows stacked)
        tile = SmemTile(kernel.tile_k * (cols // span_cols), span_cols, e, kernel.swizzle, True, span_cols, kernel.tile_k)
        return tile if tile.bytes == buffer.size else None

    def k_major(rows: int, buffer: Buffer) -> SmemTile | None:
        if k_blocks == 1:
            return tile_of_buffer(buffer, e, kernel.swizzle, False)
        # k_blocks blocks of [rows][span], one TMA box each (the moves that write them: TMA, cp.async)
        tile = SmemTile(rows * k_blocks, span_cols, e, kernel.swizzle, False, span_cols, rows)
        return tile if tile.bytes == buffer.size else None

    a_tile = blocks(kernel.tile_m, buffers["A0"]) if a_mn else k_major(kernel.tile_m, buffers["A0"])
    b_tile = blocks(kernel.tile_n, buffers["B0"]) if b_mn else k_major(kernel.tile_n, buffers["B0"])
    if a_tile is None or b_tile is None:
        return None

    def copy(move: str, vector: int, rows: int, tile: SmemTile) -> StageCopy:
        # TMA (and a staged operand, read by TMA) writes 16-byte chunks; threads write their vectors
        vec = 16 // e if move in ("tma", "staged") else (vector if move == "cp.async" else 1)
        return StageCopy(kernel.tile_k, rows, vec, True, tile)

    desc = WgmmaDescriptor(16, 8 * 128, kernel.swizzle)  # LBO unused by swizzled K-major; SBO: 8 rows
    # MN-major: LBO from one 64-column block to the next, SBO from 8 k rows to the next 8
    mn_desc = WgmmaDescriptor(kernel.tile_k * kernel.swizzle, 8 * kernel.swizzle, kernel.swizzle, True)
    a_desc, b_desc = (mn_desc if a_mn else desc), (mn_desc if b_mn else desc)
    stride = buffers["A1"].offset - buffers["A0"].offset if kernel.stages > 1 else 0
    if any(buffers[f"{x}{s}"].offset != buffers[f"{x}0"].offset + s * stride
           for x in "AB" for s in range(kernel.stages)):
        return None  # the emitter prints stages evenly spaced
    b_copy = (StageCopy(kernel.tile_n, kernel.tile_k, 16 // e, False, b_tile) if b_mn  # TMA's 16-byte chunks along n
              else copy(kernel.b_move, kernel.b_vector, kernel.tile_n, b_tile))
    a_copy = (StageCopy(kernel.tile_m, kernel.tile_k, 16 // e, False, a_tile) if a_mn  # TMA's 16-byte chunks along m
              else copy(kernel.a_move, kernel.a_vector, kernel.tile_m, a_tile))
    return WgmmaOperands(consumers, kernel.tile_m // (64 * consumers), a_tile, b_tile,
                         a_copy, b_copy, a_desc, b_desc, kernel.tile_k,
                         kernel.stages, buffers["A0"].offset, buffers["B0"].offset, stride)


def tile_of_buffer(buffer: Buffer, elem_bytes: int, swizzle: int, k_rows: bool) -> SmemTile:
    """The stage tile a buffer of `habu.lower.smem` holds (its rows and padded row length)."""
    return SmemTile(buffer.rows, buffer.row_elems, elem_bytes, swizzle, k_rows)


def ldmatrix_read(operand: OperandFragment, kmajor: bool, tile: SmemTile) -> LdmatrixRead:
    """How the mma.sync path reads an operand's stage tile: plain ldmatrix where it is stored
    k-contiguous, ldmatrix.trans where it is stored mn-contiguous (A [k][m], B [k][n]); the lanes point
    at the rows of the blocks the operand's registers hold (`OperandFragment`)."""
    trans = not kmajor
    return LdmatrixRead(operand.matrices, trans, *operand.read_shape(trans)[:2], tile,
                        row_blocks=operand.read_shape(trans)[2])


def mma_sync_operands(kernel: ContractionKernel, a_dtype: str, b_dtype: str, b_kmajor: bool,
                      buffers: dict[str, Buffer], a_kmajor: bool = True) -> MmaSyncOperands | None:
    """The mma.sync path's maps for a kernel, or None where its tile does not split into m16n8k16
    tiles over a 2 × (warps/2) warp grid (the path refuses such a plan). Each operand is staged as it
    is stored (A [BM][BK+8] or, stored [k m], [BK][BM+8]; B likewise) and read by ldmatrix, with .trans
    for the mn-contiguous ones: no operand is copied transposed."""
    if kernel.warps < 2 or a_dtype != b_dtype or DTYPES[a_dtype].bytes != 2:
        return None
    e = DTYPES[a_dtype].bytes
    wm = 2
    wn = kernel.warps // wm
    if kernel.tile_m % (16 * wm) or kernel.tile_n % (8 * wn) or kernel.tile_k % 16:
        return None
    grid = WarpGrid(wm, kernel.tile_m // wm, kernel.tile_n // wn)
    gather4 = kernel.a_move == "tma-gather4"
    # (a staged operand's buffer is read by cp.async, or by ldg: `main_loop_move`)
    a_move = main_loop_move(str(kernel.mma), str(kernel.a_move), kernel.a_vector, e)
    a_vec = kernel.a_vector if a_move == "cp.async" else (kernel.tile_k if gather4 else 1)
    b_vec = kernel.b_vector if main_loop_move(str(kernel.mma), str(kernel.b_move), kernel.b_vector, e) == "cp.async" else 1
    if gather4 and not a_kmajor:
        return None  # gather4 brings whole k rows of A
    a_tile = tile_of_buffer(buffers["A0"], e, kernel.swizzle, not a_kmajor)
    b_tile = tile_of_buffer(buffers["B0"], e, kernel.swizzle, not b_kmajor)
    a_copy = (StageCopy(kernel.tile_k, kernel.tile_m, a_vec, True, a_tile) if a_kmajor
              else StageCopy(kernel.tile_m, kernel.tile_k, a_vec, False, a_tile))
    b_copy = (StageCopy(kernel.tile_k, kernel.tile_n, b_vec, True, b_tile) if b_kmajor
              else StageCopy(kernel.tile_n, kernel.tile_k, b_vec, False, b_tile))
    a_read = ldmatrix_read(A_OPERAND, a_kmajor, a_tile)
    b_read = ldmatrix_read(B_OPERAND, b_kmajor, b_tile)
    return MmaSyncOperands(kernel.warps, grid, a_tile, b_tile, a_copy, b_copy, a_read, b_read, kernel.tile_k)


def operands_for(kernel: ContractionKernel, a: Access, b: Access,
                 fma_grid: tuple[int, int, int, int] | None = None) -> MmaSyncOperands | FmaOperands | WgmmaOperands | None:
    """The shared-memory operand maps of a kernel's path (mma.sync, fma; None for wgmma, which prints
    its own yet). Kept by the fields they read: the search lowers tens of thousands of schedules."""
    b_kmajor = b.positions[-1].axis == "k"
    a_kmajor = a.positions[-1].axis == "k"
    key = (kernel.mma, kernel.warp_specialized, kernel.stages, kernel.store, kernel.tile_m, kernel.tile_n, kernel.tile_k, kernel.warps, kernel.swizzle, kernel.a_move,
           kernel.b_move, kernel.a_vector, kernel.b_vector, a.dtype, b.dtype, a_kmajor, b_kmajor)
    if key not in _OPERANDS:
        if kernel.mma == "mma.sync":
            layout = tensor_core_smem(kernel, a.dtype, b.dtype, b_kmajor, a_kmajor)
            _OPERANDS[key] = mma_sync_operands(kernel, a.dtype, b.dtype, b_kmajor,
                                               {buf.name: buf for buf in layout.buffers}, a_kmajor)
        elif kernel.mma == "wgmma":
            layout = tensor_core_smem(kernel, a.dtype, b.dtype, b_kmajor, a_kmajor)
            _OPERANDS[key] = wgmma_operands(kernel, a, b, {buf.name: buf for buf in layout.buffers},
                                            consumer_warpgroups(kernel.warps, kernel.warp_specialized))
        elif kernel.mma == "fma":
            layout = simt_smem(kernel, a.dtype, b.dtype)
            _OPERANDS[key] = fma_operands(kernel, a, b, {buf.name: buf for buf in layout.buffers}, fma_grid)
        else:
            _OPERANDS[key] = None
    return _OPERANDS[key]


_OPERANDS: dict[tuple, MmaSyncOperands | FmaOperands | WgmmaOperands | None] = {}


__all__ = ["WGMMA_K_SPANS", "FmaOperands", "LdmatrixRead", "MmaSyncOperands", "SmemTile", "StageCopy", "ThreadGrid", "WarpGrid", "WgmmaDescriptor", "WgmmaOperands", "fma_operands", "ldmatrix_read", "mma_sync_operands", "operands_for", "wgmma_operands"]
