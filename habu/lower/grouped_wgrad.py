"""Lowering the grouped weight gradient (habu/plan/grouped_wgrad.py): `O[E[r] m n] += scale · P[r] · A[r m] · B[r n]`
with E a grouping, every group's product `O[g] += A[rows of g]ᵀ · B[rows of g]` in one launch, on wgmma.

    block (bx, by) -> group g = by, tile (mt, nt) = (bx / n_tiles, bx mod n_tiles) of the group's output
    the group's rows offs[g] .. offs[g + 1] − 1 (the offsets: a warp's search over E each, 32 reads a round,
        `lower_bound`; offs[0] and offs[#G] too, for the error flag on E's values)
        are its k axis: k tile kt holds rows `row(offs[g], kt, i)` = offs[g] + kt·bk + i, i < bk, masked
        at offs[g + 1] (`row_inside`: zeros past the group, never the next group's rows); an empty
        group's blocks do nothing
    warpgroup 0 (producer): per k tile, each thread loads its chunks of 8 elements of A's and B's rows
        (`chunk`, `a_source`, `b_source`: a row's chunks on consecutive threads; gathered rows through
        IX, masked rows and columns zero; an f32 A times P[r] then split into two bf16 parts hi and lo),
        waits until the stage is free, stores them into the stage's MN-major tiles (`a_stored_column`: an
        f32 A's parts side by side, block by block of 64 columns) and arrives on the stage's barrier; under
        `wgrad_copy` cp.async, a bf16 operand it does not scale is copied into the same places by cp.async
        after the wait (zero-filled where masked), the thread's arrival made as its copies land; under staged
        (the default) every operand is copied: an f32 A raw, two 16-byte halves a chunk, into the bytes its
        slab's parts take (`a_staged_offset`), a scaled bf16 A into its own slots; a side gathered through
        one index tensor has its rows' indices copied by cp.async `index_depth` k tiles ahead into the thread's
        own entries of the index ring (`index_tile`, `index_slot`, `index_entry`, `index_wait`), so no copy
        waits on a load of IX[r]
    warpgroups 1..C (consumers): under staged, first each splits its slabs of an f32 A in place (reads its
        chunks `convert_source`, meets its warpgroup, writes the parts, times P[r] first, fences, meets
        again) or rounds a bf16 A times P[r] in place; then wgmma with both transpose bits, each real slab q of 64 rows of m once a
        part (`part_slab`: the descriptor slab of its hi and lo blocks) into one accumulator; then the
        epilogue adds each accumulator pair into O[g, m, n] (a block owns its tile: a plain read, add and
        store, no atomics), where m < #M and n < #N; a thread reads `epilogue_batch` column groups' prior
        values before it adds and stores any of them (their loads in flight together: O is past the L2)

Persistent (`wgrad_persistent`): a block a resident slot, each walking the work items w = blockIdx.x, + gridDim.x, ...
(`walk`), item w group g's output tile (`work_item`: a group's tiles on consecutive items); every group's offsets
found once a block; the ring (and the index ring) run on from one item to the next, so the producer fills the
stages with the next item's k tiles while the consumers add this one's tile into O; no index copy past an item's k
tiles (`index_staged`), so none is in flight when the next item's land in the same slots.

The stage tiles, descriptors and the ring are the contraction path's (`wgmma_operands` on a shadow whose A
tile is `parts`·bm columns wide, `wgmma_ring` with the producer threads' arrivals), so the finite-field check
routes every element through the same maps (habu.prove.interp_grouped_wgrad) and the emitter prints them
(habu.emit_cuda.emit_grouped_wgrad)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from habu.lower.access import Access, access_for, cdiv
from habu.lower.fragments import ACCUMULATOR, AccumulatorFragment
from habu.lower.grouped_wgmma import register_split, slab_refusal, wgmma_consumers
from habu.lower.layouts import WgmmaOperands, wgmma_operands
from habu.lower.pipeline import MbarrierRing, wgmma_ring
from habu.lower.registers import WARPGROUP, RegisterSplit, warp_specialized_split
from habu.lower.smem import SmemLayout, tensor_core_smem
from habu.plan.grouped_wgrad import as_grouped_wgrad
from habu.plan.plan import ContractionKernel, GroupedKernel
from habu.spec.ir import Equation, Expr, IndexVar, Model

WGRAD_BK = 64  # rows a k tile: 64 rows of 128 bytes, one MN-major block's swizzle pattern
VECTOR = 8  # elements a producer chunk moves (16 bytes of bf16)
EPILOGUE_READS = 16  # the epilogue's reads of O in flight a thread at most (16 column groups: 32 registers)
SEARCH_LANES = 32  # a warp's reads of E a round of the offsets' search (`lower_bound`)
# shared memory a block of the wgmma targets (sm_90a, sm_100a) may opt in to: the index ring's depth is chosen to
# fit it (beside the static offs[] of 8 bytes a group at most: `OFFSET_BYTES`); the rules check the same sum
WGMMA_SMEM = 227 * 1024
OFFSET_BYTES = 8
PERSISTENT_PRODUCER_REGS = 112  # the persistent loop's producer registers (`warp_specialized_split`)


def wgrad_refusal(kernel: GroupedKernel, a_dtype: str, b_dtype: str, scaled: bool = False) -> str | None:
    """Why the grouped weight-gradient loop cannot run this kernel, or None."""
    if kernel.main_loop != "wgmma":
        return "the grouped weight gradient runs on the wgmma loop only (--pin main_loop=wgmma)"
    if a_dtype not in ("bf16", "f32") or b_dtype != "bf16":
        return "the grouped weight gradient multiplies a bf16 B with a bf16 A (or an f32 A's two bf16 parts)"
    if kernel.bk != WGRAD_BK:
        return f"the grouped weight gradient's k tile is {WGRAD_BK} rows, not {kernel.bk}"
    if (slabs := slab_refusal(kernel)) is not None:
        return slabs
    if kernel.bn % 64:
        return f"B's MN-major tile is whole blocks of 64 columns: {kernel.bn} is not"
    if kernel.stages < 2:
        return "the wgmma ring needs at least 2 stages"
    if kernel.wgrad_copy == "staged" and (a_dtype == "f32" or scaled) and kernel.bn > 128:
        # NVRTC, sm_90a: 256 columns' accumulators beside a slab's four chunks spill (300–800 bytes a thread)
        return (f"wgrad_copy=staged converts A in the consumers, whose registers hold a slab's chunks beside the "
                f"accumulators: at most 128 columns a tile, not {kernel.bn}")
    return walk_refusal(kernel) if kernel.wgrad_persistent else None


def walk_refusal(kernel: GroupedKernel) -> str | None:
    """Why the grouped weight gradient's blocks cannot persist (`wgrad_persistent`) with this kernel's copies and
    tile, or None."""
    if kernel.wgrad_copy != "staged":
        return "persistent blocks copy every operand by cp.async (--pin wgrad_copy=staged)"
    if kernel.bn > 128 and kernel.bm > 64:
        # NVRTC, sm_90a: two consumer warpgroups' 256-column accumulators beside the walk spilled (92 bytes a thread
        # at the launch's 168 registers, 360 under the persistent 112 / 192 split)
        return (f"persistent blocks of two consumer warpgroups hold at most 128 columns' accumulators beside the walk, "
                f"not {kernel.bn}")
    return None


@dataclass(frozen=True)
class WgradLoop:
    """The main loop's stage tiles, descriptors, ring and thread maps."""

    shadow: ContractionKernel  # the contraction schedule the tiles come from: A's tile parts·bm wide
    operands: WgmmaOperands
    ring: MbarrierRing
    layout: SmemLayout
    consumers: int
    parts: int  # bf16 parts of each A element: 1 (bf16 A) or 2 (f32 A: hi, lo)
    bm: int
    bn: int
    registers: RegisterSplit
    fragment: AccumulatorFragment = ACCUMULATOR
    warpgroup_size: int = WARPGROUP
    register_depth: int = 1  # k tiles of chunks a thread holds in registers: at 2, the next tile's loads in flight
    epilogue_batch: int = 16  # column groups whose prior O values a thread reads (all in flight) before adding any
    a_async: bool = False  # A's chunks copied by cp.async straight into the stage (else loaded, then stored)
    b_async: bool = False
    # the consumers rewrite their slabs of A in place before their wgmmas (`wgrad_copy` staged): an f32 A copied raw
    # (`a_staged_offset`) into the bytes its parts take, split there; a row factor applied there (a bf16 A copied to
    # its own slots, `a_store_offset`, each product rounded to bf16 in place)
    a_convert: bool = False
    # the sides whose gather's indices the producer stages `index_depth` k tiles ahead in the index ring (at
    # `index_base`, after the stage tiles and barriers), each index `index_widths` bytes, `index_counts` chunks a
    # thread a k tile
    index_sides: tuple[str, ...] = ()
    index_widths: tuple[int, ...] = ()
    index_counts: tuple[int, ...] = ()
    index_depth: int = 0
    index_base: int = 0
    # the blocks persist (`wgrad_persistent`): one a resident slot, each walking the work items (`walk`, `work_item`),
    # the ring's stage and phase running on from one item to the next
    persistent: bool = False

    def copied_async(self, side: str) -> bool:
        """Whether `side`'s chunks go by cp.async (16 bytes each, zero-filled where masked; the stage's barrier
        arrives as the thread's copies land) rather than through the thread's registers."""
        return self.a_async if side == "A" else self.b_async

    @property
    def any_async(self) -> bool:
        return self.a_async or self.b_async

    @property
    def any_registers(self) -> bool:
        return not (self.a_async and self.b_async)

    @property
    def threads(self) -> int:
        return self.warpgroup_size * (self.consumers + 1)

    def load_tile(self, step: Any) -> Any:
        """The k tile whose chunks a thread loads into its registers (the sides not `copied_async`) at loop step
        `step`, to store them at step `step + register_depth − 1`: the next tile's under this one's stores at depth
        2 (steps −(depth − 1) .. −1: the loads before the loop)."""
        return step + self.register_depth - 1

    def epilogue_rounds(self) -> int:
        """The epilogue's rounds over a thread's 8-column groups, `epilogue_batch` of them read at once each."""
        return -(-(self.bn // self.fragment.col_step) // self.epilogue_batch)

    def epilogue_group(self, rnd: Any, b: Any) -> Any:
        """The 8-column group a thread reads (then adds and stores) b-th in epilogue round `rnd`."""
        return rnd * self.epilogue_batch + b

    def warpgroup(self, tid: Any) -> Any:
        return tid // self.warpgroup_size

    def consumer(self, wg: Any) -> Any:
        return wg - 1

    def producer_thread(self, tid: Any) -> Any:
        return tid

    # -- the producer's chunks: chunk c of a k tile is its row c / (cols/8), columns 8·(c mod (cols/8))..
    def a_chunks(self) -> int:
        return self.bm * WGRAD_BK // VECTOR

    def b_chunks(self) -> int:
        return self.bn * WGRAD_BK // VECTOR

    def chunk(self, ptid: Any, j: Any) -> Any:
        """Producer thread ptid's j-th chunk (of A's, then separately of B's): consecutive threads, consecutive chunks."""
        return ptid + self.warpgroup_size * j

    def a_source(self, c: Any) -> tuple[Any, Any]:
        """(row within the k tile, first column of m) of A's chunk c."""
        per = self.bm // VECTOR
        return c // per, (c % per) * VECTOR

    def b_source(self, c: Any) -> tuple[Any, Any]:
        per = self.bn // VECTOR
        return c // per, (c % per) * VECTOR

    def a_stored_column(self, m: Any, part: Any) -> Any:
        """The stage tile's column (of its parts·bm) where part `part` of A's column m is kept: each 64-column
        block of m with its parts' blocks side by side (hi, lo), so a consumer's slab reads both from
        neighbouring blocks."""
        return (m // 64) * 64 * self.parts + part * 64 + m % 64

    def a_store_offset(self, m: Any, k: Any, part: Any) -> Any:
        """The byte of the stage's A tile where part `part` of A's (m, k) is kept (the tile's swizzle)."""
        return self.operands.a_copy.byte_offset(self.a_stored_column(m, part), k)

    def b_store_offset(self, n: Any, k: Any) -> Any:
        return self.operands.b_copy.byte_offset(n, k)

    # -- A rewritten in place by the consumers (`a_convert`)
    def slab_base(self, s: Any) -> Any:
        """The first byte of slab s's parts in the stage's A tile (its hi block's, the lo block beside it)."""
        return self.operands.a_copy.byte_offset(self.a_stored_column(s * 64, 0), 0)

    def a_staged_offset(self, m: Any, k: Any, half: Any) -> Any:
        """The byte of the stage's A tile where half `half` (4 floats) of an f32 A's chunk at (m, k) lands raw: its
        slab's bytes as 64 rows of k of 64 floats, the row's 16-byte units XOR-swizzled by k mod 8 (the consumers'
        reads of a quarter warp, 8 rows of k, fall in 8 distinct bank groups)."""
        unit = (2 * ((m % 64) // VECTOR) + half) ^ (k % 8)
        return self.slab_base(m // 64) + k * 64 * 4 + unit * 16

    def half_source(self, half: Any) -> Any:
        """The first of the 4 floats of an f32 chunk that half `half` (a 16-byte copy) takes from A's row."""
        return half * 4

    # -- a gather's indices staged ahead (`index_depth` > 0): each producer thread copies IX[r] of its chunks' rows
    # by 4- or 8-byte cp.async into its own entries of a ring of `index_slots` slots, `index_depth` k tiles ahead of
    # the copies that gather through them; one cp.async group a k tile
    def index_staged(self, tile: Any, k_tiles: Any) -> Any:
        """Whether the producer copies k tile `tile`'s indices at all: only a tile of the block's work item (a copy
        past its k tiles, still in flight when the next item's land in the same slot, could land after them)."""
        return tile < k_tiles

    def index_tile(self, step: Any) -> Any:
        """The k tile whose rows' gather indices (IX[r]) the producer copies into the index ring at loop step `step`,
        after the stage's copies (steps −index_depth .. −1: before the loop, the first index_depth tiles, a group
        each)."""
        return step + self.index_depth

    @property
    def index_slots(self) -> int:
        """The index ring's slots: the k tiles whose indices are staged at once (the one read, those in flight)."""
        return self.index_depth + 1

    def index_slot(self, tile: Any) -> Any:
        """The slot of the index ring holding k tile `tile`'s indices."""
        return tile % self.index_slots

    def index_wait(self) -> int:
        """The cp.async groups a producer thread leaves in flight (`cp.async.wait_group`) before it reads k tile kt's
        indices at step kt: the groups are the index_depth before the loop, then one a step (the step's copies and
        the indices it stages), so tile kt's are in group kt and the later index_depth − 1 may be pending."""
        return self.index_depth - 1

    def index_entry(self, side: str, slot: Any, ptid: Any, j: Any) -> Any:
        """The byte (from the stage tiles' base) of producer thread ptid's j-th chunk's index of `side` in `slot`:
        each side's slots one after another, in a slot entry j of consecutive threads side by side (a warp's 32
        copies and reads in distinct banks)."""
        at = self.index_base
        for s, width, count in zip(self.index_sides, self.index_widths, self.index_counts, strict=True):
            if s == side:
                return at + ((slot * count + j) * self.warpgroup_size + ptid) * width
            at += self.index_slots * count * self.warpgroup_size * width
        raise ValueError(f"{side}'s indices are not staged")

    def index_bytes(self) -> int:
        """The index ring's bytes: every staged side's slots."""
        return sum(self.index_slots * count * self.warpgroup_size * width
                   for width, count in zip(self.index_widths, self.index_counts, strict=True))

    @property
    def smem_total(self) -> int:
        """Dynamic shared memory: the stage tiles and barriers, the index ring after them, the base's alignment
        slack."""
        if not self.index_sides:
            return self.layout.total
        end = max(x.offset + x.size for x in self.layout.buffers)
        return self.index_base + self.index_bytes() + (self.layout.total - end)

    def a_landed_offset(self, m: Any, k: Any, half: Any = 0) -> Any:
        """Where the producer's copy of A's chunk (m, k) lands: raw (`a_staged_offset`) for an f32 A the consumers
        split, else its bf16 slot (`a_store_offset`)."""
        return self.a_staged_offset(m, k, half) if self.a_convert and self.parts == 2 else self.a_store_offset(m, k, 0)

    def convert_chunks(self) -> int:
        """Chunks of one slab (64 rows of k × 64 columns of m, 8 columns a chunk) each consumer thread rewrites."""
        return 64 * WGRAD_BK // VECTOR // self.warpgroup_size

    def convert_source(self, ctid: Any, j: Any) -> tuple[Any, Any]:
        """(row of k, first column within the slab) of consumer thread ctid's j-th chunk: consecutive threads take
        consecutive rows of k (a quarter warp's 8 reads and 8 writes in distinct bank groups)."""
        chunk = ctid + self.warpgroup_size * j
        return chunk % WGRAD_BK, (chunk // WGRAD_BK) * VECTOR

    # -- the consumers
    @property
    def slabs(self) -> int:
        """Real slabs of 64 rows of m a consumer accumulates."""
        return self.bm // (64 * self.consumers)

    def part_slab(self, q: Any, part: Any) -> Any:
        """The descriptor slab (of the shadow's parts·slabs a consumer) holding part `part` of real slab q."""
        return q * self.parts + part

    def acc_row(self, cw: Any, q: Any) -> Any:
        """The first row of m of consumer cw's accumulator q."""
        return (cw * self.slabs + q) * 64


@dataclass(frozen=True)
class GroupedWgradLowering:
    kernel: GroupedKernel
    r: str  # the rows' extent: the reduced axis
    m: str
    n: str
    g: str
    node: Equation
    a: Access  # A at axes (k: the rows, m)
    b: Access  # B at axes (k, n)
    out: Access  # O at axes (g, m, n)
    groups: str
    scale: Expr | None
    index_width: int
    row_scale: Access | None = None  # P at axis k (the row)
    loop: WgradLoop | None = None

    search_lanes = SEARCH_LANES  # (not a field) a warp's lanes: `habu::group_offsets_warp`'s ballot

    def search_rounds(self, rows: int) -> int:
        """Rounds of the warp's search (`lower_bound`) over `rows` rows until its range is empty: each leaves at
        most ⌈size / lanes⌉ − 1 rows."""
        rounds, size = 0, int(rows)
        while size > 0:
            size, rounds = -(-size // self.search_lanes) - 1, rounds + 1
        return max(1, rounds)

    def row_tables(self, side: str) -> list[str]:
        """The index tensors A's (`side` "A") or B's access gathers through at the rows' axis: IX of `X[IX[r] n]`."""
        acc = self.a if side == "A" else self.b
        return [p.table for p in acc.positions if p.kind == "gather" and p.axis == "k"]

    def staged_index(self, side: str) -> bool:
        """Whether the producer copies `side`'s gather indices into the index ring `index_depth` k tiles ahead
        (`WgradLoop.index_tile`) and gathers through the ring's entries (`wgrad_loop` decides which sides)."""
        return self.loop is not None and side in self.loop.index_sides

    def search_targets(self, g: Any, groups: Any) -> tuple[Any, Any, Any, Any]:
        """The offsets a block of one work item finds (`habu::group_offsets_warp`, one warp each): its group's first
        row and the next group's (its k axis), and group 0's and #G's (E's values below 0 or past #G raise the error
        flag). A persistent block finds every group's, 0 .. #G (`habu::group_offsets_warps`: warp w those w, w +
        the block's warps, ...)."""
        return g, self.group_end(g), 0, groups

    # -- the persistent walk (`WgradLoop.persistent`)
    def tiles(self, sizes: Mapping[str, Any]) -> Any:
        """A group's output tiles: (m tiles) × (n tiles)."""
        return cdiv(sizes[self.m], self.kernel.bm) * self.n_tiles(sizes)

    def work_items(self, sizes: Mapping[str, Any]) -> Any:
        """The persistent blocks' work: every group's output tiles."""
        return self.tiles(sizes) * sizes[self.g]

    def walk(self, block: Any, blocks: Any, items: Any) -> tuple[Any, Any, Any]:
        """The persistent walk of block `block` of `blocks` over `items` work items: (first, the bound it runs below,
        its step): items block, block + blocks, ... (every item once over the blocks)."""
        return block, items, blocks

    def work_item(self, w: Any, tiles: Any) -> tuple[Any, Any]:
        """(tile, group) of work item w: a group's tiles on consecutive items, so the blocks running at once share
        the group's rows of A and B in the L2 (the tile decoded as a block's x: `block_tile`)."""
        return w % tiles, w // tiles

    def lower_bound(self, value_at: Callable[[Any], Any], g: Any, rows: int, where: Callable[[Any, Any, Any], Any]
                    ) -> Any:
        """The first row whose group is ≥ g (#R when none), as a warp finds it (`habu::group_offsets_warp`): in
        each of `search_rounds` rounds lane l reads E at p = lo + (l + 1)·part − 1 (part = ⌈(hi − lo)/lanes⌉) where
        p < hi, n counts the lanes reading a group below g, lo += n·part and hi = min(hi, lo + (n + 1)·part − 1);
        `value_at(p)` reads E, `where(c, x, y)` selects."""
        lo: Any = g * 0
        hi: Any = g * 0 + rows
        for _ in range(self.search_rounds(rows)):
            active = lo < hi
            part = where(active, (hi - lo + self.search_lanes - 1) // self.search_lanes, 1)
            n = g * 0
            for lane in range(self.search_lanes):
                probe = lo + (lane + 1) * part - 1
                inside = active & (probe < hi)
                n = n + where(inside & (value_at(where(inside, probe, 0)) < g), 1, 0)
            top = lo + (n + 1) * part - 1
            lo, hi = where(active, lo + n * part, lo), where(active & (top < hi), top, hi)
        return lo

    uses_wgmma = True
    pair = None

    @property
    def nodes(self) -> tuple[Equation, ...]:
        return (self.node,)

    @property
    def extents(self) -> tuple[str, ...]:
        return (self.g, self.m, self.n)

    @property
    def threads(self) -> int:
        return self.loop.threads if self.loop is not None else WARPGROUP * 2

    def n_tiles(self, sizes: Mapping[str, Any]) -> Any:
        return cdiv(sizes[self.n], self.kernel.bn)

    def grid(self, sizes: Mapping[str, Any]) -> tuple[Any, Any]:
        """(tiles of one group's output, groups)."""
        return cdiv(sizes[self.m], self.kernel.bm) * self.n_tiles(sizes), sizes[self.g]

    def block_tile(self, bx: Any, n_tiles: Any) -> tuple[Any, Any]:
        """(m tile, n tile) of block x: the n tiles of one m tile on consecutive blocks (A's slice shared)."""
        return bx // n_tiles, bx % n_tiles

    def group_end(self, g: Any) -> Any:
        return g + 1

    def k_tiles(self, lo: Any, hi: Any) -> Any:
        """The group's k tiles: its rows lo .. hi − 1 in tiles of bk (none for an empty group)."""
        return cdiv(hi - lo, self.kernel.bk)

    def row(self, begin: Any, kt: Any, i: Any) -> Any:
        return begin + kt * self.kernel.bk + i

    def row_inside(self, row: Any, end: Any) -> Any:
        return row < end

    def column_m(self, mt: Any, i: Any) -> Any:
        return mt * self.kernel.bm + i

    def column_n(self, nt: Any, j: Any) -> Any:
        return nt * self.kernel.bn + j

    @property
    def a_parts(self) -> int:
        return 1 if self.a.dtype == "bf16" else 2

    def smem_bytes(self) -> int:
        return self.loop.smem_total if self.loop is not None else 0

    def dynamic_smem_bytes(self) -> int:
        return self.smem_bytes()


def wgrad_loop(kernel: GroupedKernel, a: Access, b: Access, a_scaled: bool = False,
               index_widths: Mapping[str, int] | None = None, smem_budget: int = WGMMA_SMEM) -> WgradLoop | None:
    """The main loop's maps, or None where they do not exist (the rules then refuse the plan). Under
    `wgrad_copy` cp.async, each bf16 operand the producer does not scale (B; A unless a row factor scales it)
    is copied asynchronously; an f32 A (split into parts) and a scaled one pass through registers. Under staged,
    every operand is copied and the consumers split an f32 A and apply A's row factor in place (`a_convert`), and
    each side gathered through one index tensor (`index_widths`: its entry's bytes, 4 or 8) has its indices staged
    ahead in the index ring, as many k tiles as the ring has stages where that fits in `smem_budget` bytes (fewer
    where it does not; none where not one does)."""
    if wgrad_refusal(kernel, a.dtype, b.dtype, a_scaled) is not None:
        return None
    consumers = wgmma_consumers(kernel)
    parts = 1 if a.dtype == "bf16" else 2
    shadow = ContractionKernel(nodes=kernel.nodes[:1], tile_m=kernel.bm * parts, tile_n=kernel.bn, tile_k=WGRAD_BK,
                               warps=4 * (consumers + 1), stages=kernel.stages, mma="wgmma", a_move="tma",
                               b_move="tma", a_vector=VECTOR, b_vector=VECTOR, split_k=1, raster="row", group_m=1,
                               persistent=False, warp_specialized=True, swizzle=128, index_width=kernel.index_width,
                               store="direct")
    layout = tensor_core_smem(shadow, "bf16", "bf16", b_kmajor=False, a_kmajor=False)
    staged_a, staged_b = replace(a, dtype="bf16"), replace(b, dtype="bf16")  # the tiles hold bf16 (an f32 A's parts)
    ops = wgmma_operands(shadow, staged_a, staged_b, {x.name: x for x in layout.buffers}, consumers)
    if ops is None:
        return None
    ring = wgmma_ring(kernel.stages, consumers, 1, shadow.tile_m, shadow.tile_n, WGRAD_BK, WGRAD_BK,
                      {"A": "ldg", "B": "ldg"}, True, 2, True)
    bars = next((x.offset for x in layout.buffers if x.name == "bar"), 0)
    # the producer keeps the registers it starts with (no setmaxnreg), as the grouped GEMM's f32-A producer does (a
    # 40 / 232 split for the staged loop spilled in NVRTC, sm_90a: the producer's unrolled copies need more than 40)
    copies = kernel.wgrad_copy in ("cp.async", "staged")
    staged = kernel.wgrad_copy == "staged"  # A by cp.async whatever it is; the consumers convert what needs it
    a_async = copies and (staged or (a.dtype == "bf16" and not a_scaled))
    b_async = copies and b.dtype == "bf16"
    # the next k tile's chunks held beside the current one's where the registers hold both (a bf16 A's 8 chunks, 32
    # registers a tile, up to 128-column tiles: NVRTC, sm_90a, no spills; an f32 A's two parts spill at 2)
    depth_fits = parts == 1 and kernel.bn <= 128 and not staged  # (staged: no register holds a chunk)
    # persistent: the walk's state beside an f32 A's chunks and the accumulators spilled the consumers at the launch's
    # 168 registers (NVRTC, sm_90a: 56-144 bytes); a producer of 112 leaves them 192 and spills nowhere (at 88 and
    # 56 the producer's unrolled copies spilled)
    split = (warp_specialized_split(shadow.warps, producer=PERSISTENT_PRODUCER_REGS) if kernel.wgrad_persistent
             else register_split(shadow.warps, True))
    loop = WgradLoop(shadow, ops, replace(ring, base=bars), layout, consumers, parts, kernel.bm, kernel.bn,
                     split, register_depth=2 if copies and depth_fits else 1,
                     epilogue_batch=min(EPILOGUE_READS, kernel.bn // ACCUMULATOR.col_step),
                     a_async=a_async, b_async=b_async, a_convert=staged and (parts == 2 or a_scaled),
                     persistent=kernel.wgrad_persistent)
    return index_ring(loop, index_widths or {}, smem_budget) if kernel.wgrad_index_ring else loop


def index_ring(loop: WgradLoop, widths: Mapping[str, int], smem_budget: int) -> WgradLoop:
    """`loop` with its gathered sides' indices staged ahead (`index_depth`): under staged copies (no side through
    the producer's registers), each side copied by cp.async whose rows gather through one index tensor of 4- or
    8-byte entries (cp.async's sizes), as deep as the ring (its stages) where the shared memory allows. ncu of the
    staged dW3 (H200, session 51): 15% of the stall samples at the producer's per-chunk checks, each waiting on its
    own load of IX[r] before the copy it addresses, and 31% at the consumers' wait for a full stage."""
    sides = tuple(s for s in "AB" if s in widths and widths[s] in (4, 8) and loop.copied_async(s))
    if not sides or loop.any_registers:
        return loop
    end = max(x.offset + x.size for x in loop.layout.buffers)
    per = {"A": loop.a_chunks() // loop.warpgroup_size, "B": loop.b_chunks() // loop.warpgroup_size}
    for depth in range(loop.ring.stages, 0, -1):
        staged = replace(loop, index_sides=sides, index_widths=tuple(widths[s] for s in sides),
                         index_counts=tuple(per[s] for s in sides), index_depth=depth, index_base=-(-end // 16) * 16)
        if staged.smem_total <= smem_budget:
            return staged
    return loop


def lower_grouped_wgrad(model: Model, kernel: GroupedKernel, eq: Equation,
                        storage: Mapping[str, str] | None = None) -> GroupedWgradLowering:
    gw = as_grouped_wgrad(model, eq)
    if gw is None:
        raise ValueError(f"{eq.target} is not a grouped weight gradient")
    gv = IndexVar("g", gw.group_extent)
    axis_of = {gw.r: "k", gw.m: "m", gw.n: "n", gv: "g"}
    extent_of_axis = {"k": gw.r.extent, "m": gw.m.extent, "n": gw.n.extent, "g": gw.group_extent}
    a = access_for(model.tensor(gw.a.tensor), gw.a.indices, axis_of, extent_of_axis, storage)
    b = access_for(model.tensor(gw.b.tensor), gw.b.indices, axis_of, extent_of_axis, storage)
    out = access_for(model.tensor(eq.target), (gv, gw.m, gw.n), axis_of, extent_of_axis, storage)
    row_scale = None if gw.row_scale is None else \
        access_for(model.tensor(gw.row_scale.tensor), gw.row_scale.indices, axis_of, extent_of_axis, storage)
    widths = {}
    for side, acc in (("A", a), ("B", b)):
        tables = [p.table for p in acc.positions if p.kind == "gather" and p.axis == "k"]
        if len(tables) == 1:
            widths[side] = model.tensor(tables[0]).dtype.bytes  # type: ignore[union-attr]
    groups = model.sizes.get(gw.group_extent)
    offsets = OFFSET_BYTES * ((groups or 0) + 1)  # the block's offs[] beside the dynamic shared memory
    return GroupedWgradLowering(kernel, gw.r.extent, gw.m.extent, gw.n.extent, gw.group_extent, eq, a, b, out,
                                gw.groups, gw.scale, kernel.index_width, row_scale,
                                wgrad_loop(kernel, a, b, row_scale is not None, widths, WGMMA_SMEM - offsets))


__all__ = ["WGRAD_BK", "GroupedWgradLowering", "WgradLoop", "lower_grouped_wgrad", "walk_refusal", "wgrad_refusal"]
