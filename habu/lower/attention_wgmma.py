"""The fused attention kernel's Hopper main loop (`AttentionKernel.main_loop = "wgmma"`, FlashAttention-3 style):
the FlashAttention-2 lowering (habu/lower/attention.py: the grid, the rows and keys, the mask, the causal skip,
the online softmax) with the operands moved by TMA and multiplied by wgmma.

    block x -> query tile qt, batch element (`query_tile`, `batch_flat`, `batch_coords`, as mma.sync)
    warpgroup 0 (producer; one thread issues): Q's tile once, #E/64 TMA boxes of 64 columns × bm rows at
        `q_box_origin` into `q_box_dst` (128-byte swizzle), completing on the Q barrier (`q_bar`); then per
        KV tile kt < `kv_tiles` (the causal skip): wait `empty[stage]`, expect the stage's bytes, #E/64 boxes
        of K (64 columns × bn keys, `k_box_origin` -> `k_box_dst`) and #D/64 of V (`v_box_origin` ->
        `v_box_dst`) into `full[stage]`; the ring is the contraction path's `MbarrierRing` (K's boxes its
        A load, V's its B load), the stage of tile kt = kt mod S.
    warpgroup 1 + cw (consumer cw, query rows cw·64 .. cw·64 + 63 of the tile): wait Q; per KV tile wait
        `full[stage]`; S = Q·Kᵀ by #E/16 wgmma m64n{bn}k16 (both operands K-major in shared memory,
        descriptors `q_start`, `k_start`); scale, mask (where the tile is not `unmasked`), the online
        softmax on S's accumulator registers (`s_element`: register (j, h, q) of lane l of warp w holds
        row cw·64 + 16w + l/4 + 8h, key 8j + 2(l%4) + q); P = exp(S − m) packed to bf16 as the register A
        operand of O += P·V (`p_registers`: S's registers of two adjacent 8-key groups are the A fragment
        of a k16 step), bn/16 wgmma m64n{#D}k16 with V MN-major from shared memory (`v_start`, the
        instruction's transposed B). FA3's intra-warpgroup overlap: tile kt + 1's S is issued before tile kt's
        P·V, O is rescaled by tile kt's alpha between the two issues (while S runs), tile kt + 1's softmax
        runs while P(kt)·V(kt) does (wgmma.wait_group 1), then P(kt + 1) is packed; tile kt's stage is released (one arrival on `empty[stage]`) after tile kt + 1's S has been issued, the
        last tile's at once: the contraction consumers' schedule habu.prove.pipeline runs.
    epilogue: l summed over a row's 4 lanes, O · div0(1, l) (one division a row) stored at `o_element`, or (the
        default, `out_vectors`) in 16-byte vectors after the row's lanes trade column pairs by shuffles
        (habu/lower/quad_vectors.py; `o_vector_element`).
    split-KV (`kernel.kv_split`, a decode's flash-decoding; not persistent): block x is split s = `block_split(x)`
        of its work tile, its KV tiles `first_tile(s)` .. `end_tile(s, tiles)`; the consumers keep the split's
        partial (unnormalised O at `o_element`, m and l from each row's first lane) in the launch's workspaces
        (`partial_offset`, `partial_slot`), count the block on its query tile's counter, and the last split's
        consumers combine (the FA2 lowering's `combine_*` maps, the weights in the words below the barriers:
        `combine_words`).
    persistent (`kernel.persistent`, not the default): a grid of min(work tiles, SMs) blocks, block b walking the
        work tiles (the blocks above, heaviest first) `work_of(b, n, gridDim.x)` for n = 0, 1, ...; the producer
        and the consumers keep the ring's (stage, phase) across tiles (a running KV-tile count); Q's one buffer
        passes from tile to tile by `q_bar` (parity `q_full_parity(n)` of the block's n-th tile) and `q_empty`
        (each consumer arrives once its tile's last S is done, `q_released`; the producer waits
        `q_free_parity(n)` before the next Q), so the next tile's Q and first K/V land while the consumers run
        this tile's last P·V and epilogue (FA3's persistent kernel).

Every offset here is a byte offset from the kernel's 1024-byte aligned shared-memory base. The finite-field
interpreter (habu/prove/interp_attention_wgmma.py) writes the TMA boxes through the driver's swizzle, reads
the operands through the PTX ISA's descriptor layouts and the accumulator/A-register layouts (habu.prove.
fragments), and runs the ring (habu.prove.pipeline): a wrong box, descriptor start, register map or stage
changes the field result; a persistent block runs its whole walk (habu/prove/q_handoff.py and the
`attention-persistent-walk` rule check Q's handoff and the walk under every order and grid).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from habu.lower.access import Access, VectorAccess
from habu.lower.attention import AttentionLowering
from habu.lower.fragments import ACCUMULATOR
from habu.lower.layouts import WgmmaDescriptor
from habu.lower.pipeline import MbarrierRing, TmaOperandLoad
from habu.lower.quad_vectors import QuadVectors, quad_vectors
from habu.lower.registers import PRODUCER_REGS, RegisterSplit, warp_specialized_split
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Const, Expr, Op, Size
from habu.spec.reference import Float64

SPAN = 64  # bf16 columns of one 128-byte swizzle row (a TMA box's inner width)
SWIZZLE = 128
ROW_BYTES = SPAN * 2
SLAB = 64  # query rows of a consumer warpgroup (wgmma's m64)
THREE_CONSUMER_PRODUCER_REGS = 32  # the producer's registers beside three consumer warpgroups
K_STEP = 16  # wgmma's k16
BASE_ALIGN = 1024  # the 128-byte swizzle's period: every tile starts at a multiple of it
ELEMENT = 2  # bf16 bytes
QK_DESC = WgmmaDescriptor(16, 8 * SWIZZLE, SWIZZLE)  # K-major, 128-byte swizzle: LBO unused, SBO one 8-row atom


def wgmma_refusal(lw: AttentionLowering, target_ok: bool = True) -> str | None:
    """Why the wgmma main loop cannot run this attention kernel, or None."""
    k = lw.kernel
    if not target_ok:
        return "the target has no wgmma and TMA"
    if any(a.dtype != "bf16" for a in (lw.q, lw.k, lw.v)):
        return "the wgmma main loop multiplies bf16 Q, K and V"
    if lw.width_e is None or lw.width_d is None:
        return "the head widths must be static"
    if lw.width_e % SPAN or lw.width_d % SPAN or lw.width_e > 256 or lw.width_d > 256:
        return f"the head widths ({lw.width_e}, {lw.width_d}) must be multiples of {SPAN} up to 256 (TMA boxes " \
               "of one 128-byte swizzle span)"
    if k.bm not in (64, 128, 192):
        return f"bm = {k.bm}: the wgmma main loop takes 64, 128 or 192 query rows (one to three consumer warpgroups)"
    if k.bn % 16 or not 16 <= k.bn <= 256:
        return f"bn = {k.bn}: wgmma multiplies 16 to 256 keys in steps of 16"
    if k.warp_m != 1:
        return "warp_m is an mma.sync choice (the wgmma loop's warps own 16 rows each)"
    if k.stages < 2:
        return "the ring needs at least 2 stages"
    if k.kv_split and k.persistent:
        return "split-KV blocks run one (split, work tile) each: not persistent"
    if k.pingpong and k.bm != 2 * SLAB:
        return "ping-pong takes turns between two consumer warpgroups (bm 128)"
    for acc, inner in ((lw.q, "e"), (lw.k, "e"), (lw.v, "d")):
        axes = [p.axis for p in acc.positions]
        if any(p.kind != "axis" for p in acc.positions) or len(set(axes)) != len(axes):
            return f"{acc.tensor} is read through a gather or a repeated index (TMA loads plain boxes)"
        if axes[-1] != inner:
            return f"{acc.tensor}'s contiguous index is not its head width (TMA boxes of 64 columns of it)"
        if len(axes) > 5:
            return f"{acc.tensor} has {len(axes)} dimensions (a tensor map has at most 5)"
    return None


@dataclass(frozen=True)
class AttentionWgmmaLowering(AttentionLowering):
    """The FA2 lowering plus the Hopper main loop's maps (see the module's docstring). Constructed by
    `lower_attention_wgmma`; the fields below default only because the base's last fields do."""

    consumers: int = 1
    ring: MbarrierRing | None = None
    split: RegisterSplit | None = None
    q_offset: int = 0  # Q's tile: #E/64 blocks of bm rows × 128 bytes
    kv_offset: int = 0  # stage 0's K tile (#E/64 blocks of bn rows), then its V tile (#D/64 blocks of bn rows)
    v_in_stage: int = 0  # from a stage's K tile to its V tile
    stage_bytes: int = 0  # from one stage to the next
    q_bar: int = 0  # the Q barrier (8 bytes); the ring's barriers at `ring.base`
    content_bytes: int = 0  # the tiles and barriers, from the aligned base
    qk_desc: WgmmaDescriptor = QK_DESC  # Q and K: K-major, 8-row atoms
    v_desc: WgmmaDescriptor = QK_DESC  # V: MN-major, LBO from one 64-column block to the next (the lowering's)

    # -- threads
    @property
    def warps(self) -> int:
        return 4 * (self.consumers + 1)

    @property
    def threads(self) -> int:
        return 128 * (self.consumers + 1)

    @property
    def pingpong(self) -> bool:
        """The two consumer warpgroups take turns issuing their wgmmas (named barriers `turn_barrier`)."""
        return bool(self.kernel.pingpong) and self.consumers == 2

    def turn_barrier(self, cw: Any) -> Any:
        """The named barrier consumer cw waits on for its turn (1, 2; 0 is __syncthreads); the other passes it."""
        return 1 + cw

    @property
    def combine_barrier(self) -> int:
        """The named barrier the consumers count a split's block and combine on (after ping-pong's 1 and 2)."""
        return 3

    def consumer_of(self, tid: Any) -> Any:
        """The consumer warpgroup of thread tid (warpgroup 0 is the producer)."""
        return tid // 128 - 1

    # -- a row half's reductions over a tile's score groups in independent chains (`max_chains`, `sum_chains`)
    def chain_of(self, group: Any, chains: int) -> Any:
        """The chain 8-key score group `group` adds into: group mod chains."""
        return group % chains

    def chain_slot(self, chain: Any, half: Any) -> Any:
        """Where a row half's chain keeps its value in the thread's array of them (`mx[]`, `ls[]`): the halves
        interleaved, chain·halves + half."""
        return chain * self.fragment.halves + half

    def chain_slots(self, chains: int) -> int:
        """The array's length: every chain of every row half."""
        return chains * self.fragment.halves

    def chains_joined(self, chains: int) -> tuple[int, ...]:
        """The chains a row half's reduction joins, pairwise in this order (a tree): every one. The field check
        adds the sum's chains into their slots and joins them as listed (a chain left out, or two sharing a slot,
        leaves l wrong); a max's chains are numerics (the softmax does not depend on its shift)."""
        return tuple(range(chains))

    # -- the persistent walk (`kernel.persistent`): block b of a grid of G blocks takes the work tiles (the
    # non-persistent grid's block indices: `query_tile`, `batch_flat`) w = work_of(b, n, G) for n = 0, 1, ...
    # below `work_tiles`, in the heaviest-first order (a static snake: about LPT)
    @property
    def persistent(self) -> bool:
        return bool(self.kernel.persistent)

    def work_tiles(self, sizes: Mapping[str, Any]) -> Any:
        """The (query tile, batch element) pairs: the non-persistent launch's blocks."""
        return self.batch_count(sizes) * self.query_tiles(sizes)

    def persistent_blocks(self, work: Any, slots: Any) -> Any:
        """The persistent grid: one block a resident slot (an SM: `slots`), at most one a work tile."""
        return max(1, min(work, slots))

    def work_of(self, block: Any, n: Any, blocks: Any) -> Any:
        """The n-th work tile of block b of a grid of G blocks: a snake over the heaviest-first order, rounds of G
        tiles taken left to right, then right to left (n·G + b, then n·G + G − 1 − b), so the block that took a
        round's heaviest tile takes the next round's lightest. Increasing in n for every b (the walk ends at its
        first tile past the work). The round robin n·G + b before it ran causal 16 × 4096 d128 at 146.9 µs against
        the one-tile-a-block kernel's 138.8 (H200, 2026-12-02): a causal grid's blocks got unequal sums."""
        return n * blocks + block + (n % 2) * (blocks - 1 - 2 * block)

    # -- Q's handoff across a persistent block's work tiles: Q is single-buffered. The consumers wait `q_bar` for
    # the block's n-th tile's Q with parity `q_full_parity(n)`; each consumer warpgroup arrives once a tile on
    # `q_empty` when `q_released(done, tiles)` holds, `done` the tile's S = Q·Kᵀ products completed (checked once
    # Q has landed, done = 0, and after each S); the producer waits `q_empty` with `q_free_parity(n)` before it
    # loads the n-th tile's Q (n ≥ 1), so the next Q lands while the consumers run the last P·V and the epilogue
    @property
    def q_empty(self) -> int:
        """The Q-empty barrier: the second 8 bytes of the Q barrier's 16."""
        return self.q_bar + 8

    def q_full_parity(self, n: Any) -> Any:
        return n % 2

    def q_free_parity(self, n: Any) -> Any:
        """The parity of the phase tile n − 1's arrivals complete."""
        return (n + 1) % 2

    def visits(self, first: Any, tiles: Any) -> Any:
        """Whether a block whose KV tiles run from `first` up to `tiles` visits any (the guard of its first S and
        its last P·V; a split past a short sequence's last tile visits none: the producer loads nothing for it)."""
        return first < tiles

    def s_completed(self, ks: Any) -> Any:
        """The S products of a tile completed once KV tile ks's has (the wgmma loop starts at tile 0: no split)."""
        return ks + 1

    def q_released(self, done: Any, tiles: Any) -> Any:
        """Whether the consumers are done with Q once `done` of the tile's `tiles` S products have completed: after
        the last (at once for a tile that visits no KV tile)."""
        return done >= tiles

    # -- shared memory
    def combine_words(self) -> int:
        """The split combine's words: Q's tile and the stages (free once the last P·V is done), not the barriers
        after them."""
        return self.q_bar // 4

    def smem_bytes(self) -> int:
        """The dynamic shared memory the launch asks for: the content and the slack to align its base."""
        return self.content_bytes + BASE_ALIGN

    @property
    def q_boxes(self) -> int:
        return self.width_e // SPAN  # type: ignore[operator]

    @property
    def v_boxes(self) -> int:
        return self.width_d // SPAN  # type: ignore[operator]

    def stage_base(self, stage: Any) -> Any:
        return self.kv_offset + stage * self.stage_bytes

    def q_box_dst(self, box: Any) -> Any:
        return self.q_offset + box * (self.kernel.bm * ROW_BYTES)

    def k_box_dst(self, stage: Any, box: Any) -> Any:
        return self.stage_base(stage) + box * (self.kernel.bn * ROW_BYTES)

    def v_box_dst(self, stage: Any, box: Any) -> Any:
        return self.stage_base(stage) + self.v_in_stage + box * (self.kernel.bn * ROW_BYTES)

    # -- the TMA boxes: their origins by axis (the emitter orders them as the tensor map's dims)
    def q_box_origin(self, qt: Any, coords: Mapping[str, Any], box: Any) -> dict[str, Any]:
        return {**coords, "i": self.row(qt, 0), "e": box * SPAN}

    def k_box_origin(self, kt: Any, coords: Mapping[str, Any], box: Any) -> dict[str, Any]:
        return {**coords, "j": self.key(kt, 0), "e": box * SPAN}

    def v_box_origin(self, kt: Any, coords: Mapping[str, Any], box: Any) -> dict[str, Any]:
        return {**coords, "j": self.key(kt, 0), "d": box * SPAN}

    def box_extent(self, access: Access) -> dict[str, int]:
        """A box's size along each axis: 64 along the head width, bm query rows or bn keys, 1 per batch axis."""
        inner = access.positions[-1].axis
        return {inner: SPAN, "i": self.kernel.bm, "j": self.kernel.bn}

    # -- the wgmma descriptors' start addresses (bytes from the aligned base)
    def q_start(self, cw: Any, kk: Any) -> Any:
        """Slab cw's A operand at k step kk: block kk / 4 of Q's tile, rows cw·64.., bytes 32·(kk % 4)."""
        return self.q_offset + (kk // 4) * (self.kernel.bm * ROW_BYTES) + cw * (SLAB * ROW_BYTES) + (kk % 4) * 32

    def k_start(self, stage: Any, kk: Any) -> Any:
        """K's B operand (keys × e, K-major) at k step kk: block kk / 4 of the stage's K tile, bytes 32·(kk % 4)."""
        return self.stage_base(stage) + (kk // 4) * (self.kernel.bn * ROW_BYTES) + (kk % 4) * 32

    def v_start(self, stage: Any, kk: Any) -> Any:
        """V's B operand (keys × d, MN-major) at k step kk (keys 16kk..): 16 rows of 128 bytes into each block."""
        return self.stage_base(stage) + self.v_in_stage + kk * K_STEP * ROW_BYTES

    # -- registers
    def s_register(self, j: Any, h: Any, q: Any) -> Any:
        """The S accumulator register holding 8-key group j, row half h, column q."""
        return self.fragment.register_index(j, h, q)

    def o_register(self, dn: Any, h: Any, q: Any) -> Any:
        return self.fragment.register_index(dn, h, q)

    def s_element(self, cw: Any, warp: Any, lane: Any, j: Any, h: Any, q: Any) -> tuple[Any, Any]:
        """(row of the query tile, key of the KV tile) of S register (j, h, q) of (cw, warp, lane)."""
        row, col = self.fragment.element(warp, lane, j, h, q)
        return cw * SLAB + row, col

    def o_element(self, cw: Any, warp: Any, lane: Any, dn: Any, h: Any, q: Any) -> tuple[Any, Any]:
        """(row of the query tile, column d) of O register (dn, h, q)."""
        row, col = self.fragment.element(warp, lane, dn, h, q)
        return cw * SLAB + row, col

    def consumer_stat_row(self, cw: Any, warp: Any, lane: Any, h: Any) -> Any:
        """`stat_row` on this loop: the query tile's row whose statistics a lane of consumer cw's warp holds in its
        row half h."""
        return self.o_element(cw, warp, lane, 0, h, 0)[0]

    @property
    def out_vectors(self) -> QuadVectors | None:
        """O's stores as 16-byte vectors (habu/lower/quad_vectors.py: the lanes of a row trade column pairs first),
        where the plan asks for them (`store_vectors`; not a split's partials) and O's contiguous index is the head
        width d (every other stride is then a multiple of #D, a multiple of the vector); None: one element a store
        at `o_element`."""
        k, out = self.kernel, self.out
        last = out.positions[-1]
        if not k.store_vectors or k.kv_split or last.kind != "axis" or last.axis != "d" or self.width_d is None:
            return None
        if out.extents[-1] != self.col_extent or any(p.axis == "d" for p in out.positions[:-1]):
            return None
        return quad_vectors(self.width_d // self.fragment.col_step, DTYPES[out.dtype].bytes, self.fragment)

    def o_vector_element(self, cw: Any, warp: Any, lane: Any, u: Any, h: Any, s: Any, q: Any) -> tuple[Any, Any]:
        """(row of the query tile, column d) of element q of slot s of the lane's O vector of set u, row half h."""
        qv = self.out_vectors
        assert qv is not None
        row, col = qv.element(warp, lane, u, h, s, q)
        return cw * SLAB + row, col

    def vector_accesses(self) -> tuple[VectorAccess, ...]:
        """O's vector stores: its base address aligned to a vector (the launch checks it)."""
        qv = self.out_vectors
        if qv is None:
            return ()
        return (VectorAccess(self.out.tensor, qv.elements, f"the epilogue stores {self.out.tensor} in "
                             f"{qv.elements}-element vectors"),)

    def p_registers(self, kk: Any, reg: int) -> tuple[Any, Any]:
        """The two S registers packed (low, high half) into register reg of P's A operand at k step kk (keys
        16kk..): the base lowering's `p_fragment` (8-key group, register within it), as register indices."""
        (g0, r0), (g1, r1) = self.p_fragment(kk, reg)
        return self.s_register(g0, r0 // 2, r0 % 2), self.s_register(g1, r1 // 2, r1 % 2)

    # -- the softmax's scale
    def scale_in_exponent(self, sizes: Mapping[str, int]) -> bool:
        """Whether the scale c (the model's, times log2 e in the kernel) is folded into the exponent, as FA3: the
        running max m is taken over the raw scores, P = 2^(s·c − m·c) (one FFMA a score instead of a multiply
        and a subtraction), l and O rescaled by 2^(m_old·c − m_new·c). Only where c is a positive constant:
        with a negative one the raw scores' max would be the scaled scores' min (the exponents would overflow).
        Not where the kernel stores the row statistics (`stats`): the stored maximum is the scaled scores' (the
        model's), which the field check compares with the model's max reduction (over the field the max of the
        raw scores times c is another value)."""
        if self.stats is not None:
            return False
        if self.scale is None:
            return True
        value = constant_value(self.scale, sizes)
        return value is not None and value > 0

    def partial_max_scaled(self, sizes: Mapping[str, int]) -> bool:
        """Whether a split's partial m is the running max times the scale (the kernel keeps the raw scores' max
        where the scale is folded into the exponent: the combine's exponents m_s − M are the scaled scores')."""
        return self.scale is not None and self.scale_in_exponent(sizes)

    @property
    def s_registers(self) -> int:
        return self.fragment.registers(self.kernel.bn // 8)

    @property
    def o_registers(self) -> int:
        return self.fragment.registers(self.width_d // 8)  # type: ignore[operator]

    @property
    def register_need(self) -> int:
        """About the registers a consumer thread holds: S, O, P's packed halves and 32 for the rest, 40 with a mask
        (its row and key indices). ptxas for sm_90a, head width 64, 192 query rows (160 registers a consumer):
        128-key tiles compile without a spill unmasked and spill 88-100 B causal (session 41)."""
        return self.s_registers + self.o_registers + self.kernel.bn // 4 + (32 if self.mask is None else 40)


def constant_value(expr: Expr, sizes: Mapping[str, int]) -> float | None:
    """The float64 value of an expression of constants and sizes, or None where it loads a tensor (or an extent
    has no size)."""
    if isinstance(expr, Const):
        return float(expr.value)
    if isinstance(expr, Size):
        return float(sizes[expr.extent]) if expr.extent in sizes else None
    if isinstance(expr, Op):
        args = [constant_value(a, sizes) for a in expr.args]
        if any(a is None for a in args):
            return None
        return float(Float64().op(expr.fn, [np.asarray(a) for a in args]))
    return None


def _layout(bm: int, bn: int, e: int, d: int, stages: int) -> tuple[int, int, int, int, int, int]:
    """(Q's offset, stage 0's, a stage's bytes, the Q barrier's offset, the ring's first barrier's, the content's
    bytes) from the aligned base: Q's tile, the stages (each K's tile then V's, 1024-byte aligned), the Q
    barrier (padded to 16 bytes), each stage's full and empty barriers (16 bytes a stage)."""
    q_bytes = bm * e * ELEMENT
    stage_bytes = -(-(bn * (e + d) * ELEMENT) // BASE_ALIGN) * BASE_ALIGN
    kv_offset = -(-q_bytes // BASE_ALIGN) * BASE_ALIGN
    bars = kv_offset + stages * stage_bytes
    ring_base = bars + 16
    return 0, kv_offset, stage_bytes, bars, ring_base, ring_base + 16 * stages


def wgmma_smem_bytes(bm: int, bn: int, e: int, d: int, stages: int) -> int:
    """The dynamic shared memory the loop's launch asks for at these tiles (`AttentionWgmmaLowering.smem_bytes`)."""
    return _layout(bm, bn, e, d, stages)[-1] + BASE_ALIGN


def lower_attention_wgmma(base: AttentionLowering) -> AttentionWgmmaLowering:
    """The wgmma main loop over `base` (its kernel's main_loop is wgmma). Where the loop cannot run the
    kernel (`wgmma_refusal`) the lowering still exists (the rules refuse it, the emitter raises)."""
    k = base.kernel
    consumers = max(1, k.bm // SLAB)
    e = base.width_e or SPAN
    d = base.width_d or SPAN
    k_bytes, v_bytes = k.bn * e * ELEMENT, k.bn * d * ELEMENT
    stages = max(1, k.stages)
    q_offset, kv_offset, stage_bytes, bars, ring_base, content = _layout(k.bm, k.bn, e, d, stages)
    loads = (TmaOperandLoad("A", False, k.bn, SPAN, max(1, e // SPAN), ELEMENT),  # K's boxes
             TmaOperandLoad("B", False, k.bn, SPAN, max(1, d // SPAN), ELEMENT))  # V's boxes
    ring = MbarrierRing(stages, 1, consumers, consumers, 1, k_bytes + v_bytes, loads, 1, wrap=stages, base=ring_base)
    base_fields = {f.name: getattr(base, f.name) for f in fields(base)}
    base_fields["fragment"] = ACCUMULATOR  # warpgroups of 4 warps × 16 rows
    return AttentionWgmmaLowering(
        **base_fields, consumers=consumers, ring=ring,
        # three consumer warpgroups (bm 192): FlashAttention-3's 32 / 160 split of the 512 threads' registers
        split=warp_specialized_split(4 * (consumers + 1), producer=THREE_CONSUMER_PRODUCER_REGS if consumers == 3
                                     else PRODUCER_REGS),
        q_offset=q_offset, kv_offset=kv_offset, v_in_stage=k_bytes, stage_bytes=stage_bytes, q_bar=bars,
        content_bytes=content,
        v_desc=WgmmaDescriptor(k.bn * ROW_BYTES, 8 * SWIZZLE, SWIZZLE, True))


__all__ = ["BASE_ALIGN", "K_STEP", "SLAB", "SPAN", "SWIZZLE", "AttentionWgmmaLowering", "constant_value",
           "lower_attention_wgmma", "wgmma_refusal", "wgmma_smem_bytes"]
