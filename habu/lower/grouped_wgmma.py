"""The grouped GEMM's wgmma main loop (`GroupedKernel.main_loop = "wgmma"`): the contraction path's proven
machinery (habu/lower/layouts.py, pipeline.py, smem.py) driven by the grouped tile scheduler.

    block (x, y) -> lin = y·grid.x + x -> (mt, nt) by `tile_of` (bands of BAND row tiles walked column
        tile by column tile, so a band's gathered A rows stay in L2 while W's column tiles stream)
    (mt, nt) -> (group g, row tile m) by the grouped lowering's `decode`; a block past the last row
        tile (`live`) does nothing (producer and consumers skip it alike, so the ring stays in step)
    warpgroup 0 (producer): per k tile t, wait until stage t mod S is free, then
        W[g]'s box: one TMA load of a 3-D tensor map (dims #K, #N, #G innermost first, box bk × bn × 1)
            at `w_box_origin(g, n0, k0)` = (k0, n0, g): zero past #K and #N, never another group's rows;
        A's rows: 128 threads cp.async 16-byte chunks of rows offs[g] + m·bm + i (gathered through IX,
            masked at offs[g + 1] by `row_inside` and by the access's own masks) into the 128-byte swizzle;
            an f32 A's chunks either loaded and split into bf16 parts by the producer (`a_split` producer) or
            copied raw into the bytes its parts take (`a_staged_offset`) and split there by each consumer
            warpgroup for its own slab before its wgmmas (`a_split` consumers, `convert_source`);
    warpgroups 1..C (consumers): wgmma m64nBNk16 on their 64-row slabs, the ring's mbarriers
        (`MbarrierRing`, proven by the `pipeline-schedule` rule and executed by the interpreter), then
        the epilogue stores rows below offs[g + 1] (the next group's rows are another tile's).

`WgmmaMainLoop.shadow` is the contraction schedule the same stage tiles, ring and descriptors come from
(`tensor_core_smem`, `wgmma_operands`, `pipeline_for`): the finite-field check routes the operands
through those maps (`habu.prove.smem_route.wgmma_route`) and runs the ring (`habu.prove.pipeline`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from habu.lower.access import Access, floordiv, minimum
from habu.lower.contraction import tma_box, tma_coordinates
from habu.lower.fragments import ACCUMULATOR, AccumulatorFragment
from habu.lower.layouts import WgmmaOperands, wgmma_operands
from habu.lower.pipeline import MN_BLOCK, MbarrierRing, TmaOperandLoad, pipeline_for
from habu.lower.registers import WARPGROUP, RegisterSplit, warp_specialized_split
from habu.lower.smem import SmemLayout, tensor_core_smem
from habu.plan.plan import ContractionKernel, GroupedKernel

WGMMA_BK = 64  # a k tile is one 128-byte row of bf16: the 128-byte swizzle's span
BAND = 8  # row tiles a band walks together (`tile_of`)


def wgmma_consumers(kernel: GroupedKernel) -> int:
    """Consumer warpgroups of the wgmma main loop: the block's warps_m · warps_n warps in fours."""
    return max(1, kernel.warps_m * kernel.warps_n // 4)


def slab_refusal(kernel: GroupedKernel) -> str | None:
    """Why the block's warps do not split its rows into 64-row wgmma slabs of whole warpgroups, or None."""
    if kernel.warps_m * kernel.warps_n % 4 or kernel.bm % (64 * wgmma_consumers(kernel)) or kernel.bm < 64:
        return (f"{kernel.warps_m} × {kernel.warps_n} warps do not split a {kernel.bm}-row tile into 64-row "
                "wgmma slabs of whole warpgroups")
    return None


def wgmma_refusal(kernel: GroupedKernel, a_dtype: str, w_dtype: str, pair: bool, w_n_major: bool = False
                  ) -> str | None:
    """Why the wgmma main loop cannot run this kernel, or None."""
    if a_dtype not in ("bf16", "f32") or w_dtype != "bf16":
        return "the wgmma main loop multiplies a bf16 W with a bf16 A (or an f32 A's two bf16 parts)"
    if pair and (a_dtype != "bf16" or kernel.bn > 128):
        return "a fused pair on the wgmma main loop has a bf16 A and at most 128 columns (two accumulators)"
    if pair and w_n_major:
        return "a fused pair on the wgmma main loop reads its weights stored k-major ([g n k])"
    if w_n_major and kernel.bn % MN_BLOCK:
        return (f"an n-major W ([g k n]) is loaded in boxes of {MN_BLOCK} columns: the tile's {kernel.bn} columns "
                "are not whole boxes")
    if kernel.bk != WGMMA_BK:
        return f"the wgmma main loop's k tile is {WGMMA_BK} (one 128-byte swizzle span), not {kernel.bk}"
    if (slabs := slab_refusal(kernel)) is not None:
        return slabs
    if kernel.bn % 8 or kernel.bn > 256:
        return f"wgmma multiplies 8 to 256 columns in steps of 8, not {kernel.bn}"
    if kernel.stages < 2:
        return "the wgmma main loop's ring needs at least 2 stages"
    if a_dtype == "f32" and kernel.a_split == "consumers" and kernel.bn > 128:
        # NVRTC, sm_90a: 256 columns' accumulators beside a slab's four f32 chunks spill
        return (f"a_split=consumers splits an f32 A in the consumers, whose registers hold a slab's chunks beside the "
                f"accumulators: at most 128 columns a tile, not {kernel.bn}")
    return None


@dataclass(frozen=True)
class WgmmaMainLoop:
    """The wgmma main loop of a grouped kernel: its contraction schedule's stage tiles, ring and descriptors."""

    shadow: ContractionKernel  # the contraction schedule whose layouts and ring these are
    operands: WgmmaOperands
    ring: MbarrierRing
    layout: SmemLayout
    consumers: int
    band: int = BAND
    # an f32 A: its bf16 parts' tiles, hi at the stage's A tile and lo `lo_offset` bytes after it (the A
    # buffer holds both: it is laid out for 4-byte elements); 0 for a bf16 A
    lo_offset: int = 0
    registers: RegisterSplit | None = None
    # a fused pair: the second weights' box lands `b2_offset` bytes into the stage's B tile (its rows
    # bn .. 2·bn − 1: the tile is laid out for both, the ring's B load is two boxes); 0 without a pair
    b2_offset: int = 0
    # the consumers' accumulator map (which tile element each register holds) and thread decode, as the
    # contraction path's wgmma epilogue has them; checked against the PTX ISA's layout by the field check
    fragment: AccumulatorFragment = ACCUMULATOR
    warpgroup_size: int = WARPGROUP
    # the epilogue's f32 vector: 2 (each thread its accumulator pairs) or 4 (`quad_*`: two neighbouring lanes
    # trade the pairs of the row half the other keeps, each then holds four adjacent columns of one row)
    store_vector: int = 2
    # a fused pair's instructions a slab and k step: 2 (each box times A, n = bn, into its own accumulator) or
    # 1 (one instruction of n = 2·bn over the stage's whole B tile: both boxes, one accumulator; `pair_group`)
    pair_wgmmas: int = 2
    # an f32 A copied raw by cp.async (`a_split` consumers): each chunk's two 16-byte halves land in the bytes its
    # parts take (`a_staged_offset`), and each consumer warpgroup splits its own slab there before its wgmmas
    a_convert: bool = False

    @property
    def threads(self) -> int:
        return self.warpgroup_size * (self.consumers + 1)

    def walk(self, block: Any, blocks: Any, tiles: Any) -> tuple[Any, Any, Any]:
        """The persistent walk of block `block` of `blocks` over `tiles` tiles: (first tile, the bound it runs
        below, its step) — tiles block, block + blocks, ... (every tile once over the blocks)."""
        return block, tiles, blocks

    def producer_thread(self, tid: Any) -> Any:
        """The producer warpgroup's thread index of thread `tid` (the producer is warpgroup 0)."""
        return tid

    def warpgroup(self, tid: Any) -> Any:
        """The warpgroup of thread `tid` (0: the producer)."""
        return tid // self.warpgroup_size

    def consumer(self, wg: Any) -> Any:
        """The consumer index of warpgroup `wg` (1..C -> 0..C-1): the slabs it multiplies and stores."""
        return wg - 1

    def producer_copies(self) -> int:
        """The 16-byte copies of A's k tile each producer thread makes (A's rows by cp.async or loads)."""
        return self.operands.a_copy.count // self.warpgroup_size

    def _per_row(self) -> int:
        copy = self.operands.a_copy
        return copy.inner // copy.vector

    def a_copy_row(self, ptid: Any, j: Any) -> Any:
        """The A tile row of producer thread ptid's j-th copy: the chunks of a row go to consecutive threads."""
        per = self._per_row()
        return ptid // per + (self.warpgroup_size // per) * j

    def a_copy_k(self, ptid: Any) -> Any:
        """The k (within the k tile) of producer thread ptid's copies: the same 16-byte column of each row."""
        return (ptid % self._per_row()) * self.operands.a_copy.vector

    # -- an f32 A split by the consumers in place (`a_convert`)
    def a_staged_offset(self, i: Any, k: Any, half: Any) -> Any:
        """The byte of the stage's A buffer where half `half` (4 floats) of the f32 chunk at tile row i, k (8 floats
        from k) lands raw: row i's 64 floats fill row i of the hi tile (k < 32) and of the lo tile (`lo_offset` on),
        each row's 16-byte units XOR-swizzled by i mod 8 (a quarter warp's reads, 8 rows, in 8 bank groups)."""
        unit = k // 4 + half
        row_bytes = self.operands.a_tile.row_elems * self.operands.a_tile.elem_bytes
        return (unit // 8) * self.lo_offset + i * row_bytes + ((unit % 8) ^ (i % 8)) * 16

    def half_source(self, half: Any) -> Any:
        """The first of the 4 floats of an f32 chunk that half `half` (a 16-byte copy) takes from A's row."""
        return half * 4

    def a_landed_offset(self, i: Any, k: Any, half: Any = 0) -> Any:
        """Where the producer's copy of A's chunk (i, k) lands: raw (`a_staged_offset`) for an f32 A the consumers
        split, else its bf16 slot in the stage tile."""
        return self.a_staged_offset(i, k, half) if self.a_convert else self.operands.a_copy.byte_offset(i, k)

    def convert_chunks(self) -> int:
        """Chunks of one slab (64 rows × 64 k, 8 k a chunk) each consumer thread splits."""
        return 64 * WGMMA_BK // 8 // self.warpgroup_size

    def convert_source(self, ctid: Any, j: Any) -> tuple[Any, Any]:
        """(row within the slab, first k) of consumer thread ctid's j-th chunk: consecutive threads take
        consecutive rows (a quarter warp's 8 reads and 8 writes in distinct bank groups)."""
        chunk = ctid + self.warpgroup_size * j
        return chunk % 64, (chunk // 64) * 8

    def column_groups(self) -> int:
        """The accumulator's 8-column groups over the tile's columns (a thread's pairs j)."""
        return self.bn // self.fragment.col_step

    @property
    def one_pair_instruction(self) -> bool:
        """A fused pair multiplied by one instruction of n = 2·bn over both weights' boxes."""
        return bool(self.b2_offset) and self.pair_wgmmas == 1

    @property
    def mma_columns(self) -> int:
        """n of each wgmma instruction: the stage's whole B tile (both boxes) for a pair by one instruction,
        else the output tile's columns."""
        return 2 * self.bn if self.one_pair_instruction else self.bn

    def accumulator_groups(self) -> int:
        """The 8-column groups of one accumulator (an instruction's n / 8): a thread's pairs j."""
        return self.mma_columns // self.fragment.col_step

    def pair_group(self, j: Any, which: int) -> Any:
        """The accumulator group holding output group j of the pair's product `which` (0: the first weights',
        1: the second's): by one instruction, the second weights' box is the B tile's rows bn.., so their
        columns are the accumulator's groups after the first's; by two, each has its own accumulator."""
        return j + which * self.column_groups() if self.one_pair_instruction else j

    @property
    def a_parts(self) -> int:
        return 2 if self.lo_offset else 1

    def tile_of(self, lin: Any, gx: Any, gy: Any) -> tuple[Any, Any]:
        """(mt, nt) of block `lin` of a gx × gy grid: bands of `band` row tiles, m fastest within a band
        (the last band holds the rows left), each band walking every column tile."""
        per_band = self.band * gy
        band = floordiv(lin, per_band)
        first = band * self.band
        rows = minimum(gx - first, self.band)
        within = lin - band * per_band
        nt = floordiv(within, rows)
        return first + within - nt * rows, nt

    # -- the 4-wide epilogue (store_vector 4): lanes 2m, 2m + 1 of a row's four (lane % 4) trade pairs by one
    # shuffle; the even lane keeps row half 0 (row lane/4) and takes its partner's pair of that row, the odd one
    # keeps half 1 (row lane/4 + 8) and takes its partner's pair of that row: four adjacent columns each
    def quad_partner(self, lane: Any) -> Any:
        """The lane a lane trades pairs with (its neighbour in the row's four: lane ^ 1)."""
        return lane + 1 - 2 * (lane % 2)

    def quad_kept_half(self, lane: Any) -> Any:
        """The row half h whose pairs a lane stores (the other half's pair it sends to its partner)."""
        return lane % 2

    def quad_column(self, lane: Any, j: Any) -> Any:
        """The first of the four columns (within the tile) lane `lane` stores for its 8-column group j."""
        f = self.fragment
        return f.col_step * j + f.pair * (lane % f.lanes_per_row) - f.pair * (lane % 2)

    def quad_slot(self, owner: Any, q: Any) -> Any:
        """Where among the four stored columns the pair of lane `owner` lies (its column q): the even lane's
        first, the odd lane's after it."""
        return self.fragment.pair * (owner % 2) + q

    def quad_source(self, lane: Any, i: int) -> tuple[Any, Any, Any, Any]:
        """What the 4-wide epilogue stores at slot i (0..3) of lane `lane`'s four columns, as the emitter
        prints it: (the lane whose register it is, its row half, its column q = i mod 2, whether any): the
        lane's own register of its kept half where `quad_slot(lane, q)` is i, else where the partner's pair
        lands there (`quad_slot(partner, q)`) the register of the half the partner sends (the kept half of
        the partner's partner: the shuffle is a read from `quad_partner(lane)`, modulo the warp's 32 lanes),
        else none (0.0 is stored)."""
        q = i % self.fragment.pair
        partner = self.quad_partner(lane) % 32
        own = self.quad_slot(lane, q) == i
        got = self.quad_slot(partner, q) == i
        src = own * lane + (1 - own) * partner
        half = own * self.quad_kept_half(lane) + (1 - own) * self.quad_kept_half(self.quad_partner(partner) % 32)
        return src, half, q, own | got

    @property
    def w_load(self) -> TmaOperandLoad:
        """The ring's load of W's tile (B's): one box of bn rows by bk (k-major W), or bn/64 boxes of 64
        columns by bk rows of k (n-major W, read with the transpose bit); a pair's two boxes, one of each
        weights."""
        load = self.ring.load("B")
        assert load is not None, "the wgmma loop's ring loads W by TMA"
        return load

    @property
    def w_boxes(self) -> int:
        """W's boxes a k tile issues for one weights (a pair's second weights: the same again, from its own map)."""
        return 1 if self.b2_offset else self.w_load.boxes

    def w_box_origin(self, g: Any, n0: Any, k0: Any, box: Any = 0) -> dict[str, Any]:
        """The origin of W[g]'s box `box` of the k tile at k0 and the column tile at n0, by W's axes: the
        tile's group along #G (box 1), the box's first column along #N (n0 + box·64 for an n-major W's
        boxes: `TmaOperandLoad.origin`), k0 along #K."""
        first = self.w_load.origin(n0, k0, box)
        n, k = first if self.w_load.mn_major else (first[1], first[0])
        return {"g": g, "n": n, "k": k}

    def w_box_landing(self, box: Any) -> Any:
        """The byte of the stage's B tile where W's box `box` lands (`TmaOperandLoad.landing`)."""
        return self.w_load.landing(box)

    def w_box_rows(self, box: Any) -> Any:
        """The first row (column of the output tile) of W's box `box` within the tile: the tile rows it
        fills."""
        return self.w_load.row_box(box) * self.w_load.box_rows

    def w_box_coordinates(self, w: Access, g: Any, n0: Any, k0: Any, box: Any = 0) -> tuple[Any, ...]:
        """Box `box`'s coordinates in W's tensor map, innermost first."""
        return tma_coordinates(w, self.w_box_origin(g, n0, k0, box))

    @property
    def bn(self) -> int:
        """Columns of the output tile (a pair's stage tile holds both weights' boxes: twice as many rows)."""
        return self.shadow.tile_n // (2 if self.b2_offset else 1)

    def w_box(self, w: Access) -> tuple[int, ...]:
        """W's TMA box, innermost first: bk along #K, bn along #N (64 where W is n-major: its boxes), 1
        along #G."""
        load = self.w_load
        return tma_box(w, "n", self.bn if self.b2_offset else load.box_rows, load.box_k)

    def second_b_start(self) -> int:
        """Where the pair's second weights start in the stage's B tile (the descriptor start of its reads):
        row bn of the tile."""
        return self.operands.b_tile.linear_offset(self.bn)


def wgmma_main_loop(kernel: GroupedKernel, a: Access, w: Access, pair: bool = False) -> WgmmaMainLoop | None:
    """The wgmma main loop of `kernel` (None where its maps do not exist: the rules refuse the plan)."""
    consumers = wgmma_consumers(kernel)
    split = a.dtype == "f32"  # the producer loads f32 rows and stores their bf16 parts (plain loads)
    convert = split and kernel.a_split == "consumers"  # or copies them raw, split by the consumers
    b_rows = kernel.bn * (2 if pair else 1)  # a pair: both weights' boxes in one stage tile
    shadow = ContractionKernel(nodes=kernel.nodes[:1], tile_m=kernel.bm, tile_n=b_rows, tile_k=WGMMA_BK,
                               warps=4 * (consumers + 1), stages=max(2, kernel.stages), mma="wgmma",
                               a_move="ldg" if split and not convert else "cp.async", b_move="tma", a_vector=8, b_vector=8,
                               split_k=1, raster="row", group_m=1, persistent=False, warp_specialized=True,
                               swizzle=128, index_width=kernel.index_width, store="direct")
    # an f32 A's stage buffer is laid out for 4-byte elements: room for its two bf16 parts' tiles
    layout = tensor_core_smem(shadow, a.dtype, w.dtype, w.positions[-1].axis == "k")
    staged = replace(a, dtype="bf16") if split else a  # the tiles the consumers read hold bf16
    ops = wgmma_operands(shadow, staged, w, {b.name: b for b in layout.buffers}, consumers) \
        if staged.dtype == w.dtype == "bf16" else None
    if ops is not None and split:  # the producer stores an f32 A's parts 16 bytes (8 bf16) at a time
        ops = replace(ops, a_copy=replace(ops.a_copy, vector=8))
    ring = pipeline_for(shadow, staged.dtype, w.positions[-1].axis, "k", w.dtype)  # W n-major: its 64-column boxes
    if ops is None or not isinstance(ring, MbarrierRing):
        return None
    b2 = 0
    if pair:  # B's load: two boxes of bn rows (the weights, then the second weights), the same bytes
        load = ring.load("B")
        assert load is not None
        ring = replace(ring, loads=tuple(replace(ld, box_rows=kernel.bn, boxes=2) if ld.side == "B" else ld
                                         for ld in ring.loads))
        b2 = load.box_bytes // 2
    return WgmmaMainLoop(shadow, ops, ring, layout, consumers, lo_offset=ops.a_tile.bytes if split else 0,
                         registers=register_split(shadow.warps, split), b2_offset=b2,
                         store_vector=kernel.store_vector, pair_wgmmas=kernel.pair_wgmmas if pair else 2,
                         a_convert=convert)


def register_split(warps: int, f32_a: bool) -> RegisterSplit:
    """The contraction path's split (40 producer registers), or for an f32 A none: the producer keeps the
    registers it starts with (two k tiles of 16 float4 loads each, one in flight while the other's parts are
    stored) and so do the consumers (128 columns: 64 accumulator registers a slab)."""
    base = warp_specialized_split(warps)
    if not f32_a:
        return base
    # both at the launch's count: no setmaxnreg at all (a consumer's `inc` to fewer registers than ptxas gave the
    # kernel is no increase: at 8 warps, 248 at launch and an `inc` to 232, ptxas gave 232 and the demand of a
    # producer "keeping 248" exceeded the pool)
    return replace(base, producer=base.at_launch, consumer=base.at_launch)


__all__ = ["BAND", "WGMMA_BK", "WgmmaMainLoop", "wgmma_consumers", "wgmma_main_loop", "wgmma_refusal"]
