"""The k loop's pipelines as lowering data: which stage holds k tile t, which barrier phase a wait
names, how many arrivals and bytes complete a phase, where each TMA box is loaded from.

The emitters print these numbers and expressions; `habu.prove.pipeline` executes them (producer and
consumers over the k tiles, with the mbarrier and cp.async-group semantics) to prove the ring never
deadlocks, that a consumer reads the stage holding exactly its tile, and that the bytes a phase
expects are the bytes its boxes bring; the finite-field interpreter multiplies the k tiles the
schedule delivers (`habu.prove.pipeline.delivered`), so a wrong stage index changes the result.

    mbarrier ring (wgmma): k tile t of a block (counted over all its output tiles) uses stage
        t mod S in phase (t div S) mod 2; the producer waits `empty[stage]` with parity
        phase ^ producer_parity (a fresh barrier counts its phase "-1" as complete), fills the
        stage and completes `full[stage]` (full_arrivals arrivals and expect_tx bytes); each
        consumer warpgroup waits `full[stage]` with parity phase ^ consumer_parity and releases
        the stage (one arrival on each block of its cluster) once its next tile is issued.
    cp.async ring (mma.sync): the prologue commits tiles 0..P-1, iteration j waits until at
        most W groups are in flight, then refills the stage of tile j - 1 with tile j + P.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

MN_BLOCK = 64  # columns of an MN-major box: one 128-byte swizzle span of 16-bit elements
SPAN_BYTES = 128  # the swizzle span: the inner extent of every box (TMA's 128-byte swizzle holds no more)


class L2Hint(enum.StrEnum):
    """The L2 cache policy a TMA load carries (`habu::l2_policy_<value>()`; NONE: a plain load)."""

    NONE = ""
    EVICT_LAST = "evict_last"
    EVICT_FIRST = "evict_first"


def l2_hints(kernel: Any) -> dict[str, L2Hint]:
    """Each operand side's L2 policy (`TmaOperandLoad.l2_hint`): both evict-last under `keep_operands`; A
    evict-last and B evict-first under `stream_b` (a product that streams B once, past the L2; habu/paths/l2_keep.py)."""
    if getattr(kernel, "stream_b", False):
        return {"A": L2Hint.EVICT_LAST, "B": L2Hint.EVICT_FIRST}
    keep = L2Hint.EVICT_LAST if getattr(kernel, "keep_operands", False) else L2Hint.NONE
    return {"A": keep, "B": keep}


@dataclass(frozen=True)
class TmaOperandLoad:
    """An operand's TMA loads per k tile: `boxes` boxes of `box_rows` rows (of m or n) by `box_k`
    columns of k; box j covers tile rows [j·box_rows, (j+1)·box_rows) and lands at byte
    j·box_bytes of the stage. In a cluster of `cluster` blocks sharing the tile (B multicast),
    box j is issued by block j mod cluster into every block of `mask`; otherwise each block issues
    all its boxes into itself (mask 0). With `k_boxes` > 1 (a K-major k tile of several swizzle
    spans) the boxes also run along k: box j covers rows of row box j mod (boxes / k_boxes) and the
    k columns [kb·box_k, (kb+1)·box_k) of k box kb = j / (boxes / k_boxes), still landing at
    j·box_bytes (the stage tile keeps its k blocks one after another)."""

    side: str  # "A" or "B"
    mn_major: bool  # the operand's rows are contiguous (the box's inner coordinate is the row)
    box_rows: int
    box_k: int
    boxes: int
    element_bytes: int
    cluster: int = 1
    mask: int = 0  # multicast: the cluster ranks each box lands in (0: no multicast)
    k_step: int = 0  # how far the box's k coordinate advances per k tile (the lowering's k_step)
    bk: int = 0  # the k tile (k coordinate of the split's first tile: begin·bk)
    k_boxes: int = 1  # boxes along k per k tile (of the `boxes` in all)
    # the L2 policy the block's own loads carry ("": none; "evict_last": `keep_operands`, or A under `stream_b`;
    # "evict_first": B under `stream_b`); a multicast's loads stay plain. A hint: the bytes that land are the same
    l2_hint: L2Hint = L2Hint.NONE

    @property
    def box_bytes(self) -> int:
        return self.box_rows * self.box_k * self.element_bytes

    def issuer(self, box: Any) -> Any:
        """The cluster rank that issues box `box` of a multicast load (without multicast every block
        issues its own boxes)."""
        return box % self.cluster

    def lands_in(self, box: int, rank: int, issuer: int) -> bool:
        """Box `box`, issued by the block of rank `issuer`, reaches the stage of the block of rank `rank`."""
        if self.mask:
            return issuer == self.issuer(box) and bool(self.mask >> rank & 1)
        return issuer == rank

    def k_coordinate(self, begin: Any, step: Any) -> Any:
        """The k coordinate of the boxes of the `step`-th k tile of a split starting at tile `begin`."""
        return begin * self.bk + step * self.k_step

    @property
    def row_boxes(self) -> int:
        return self.boxes // self.k_boxes

    def row_box(self, box: Any) -> Any:
        """The row box (along m or n) of box `box`."""
        return box % self.row_boxes if self.k_boxes > 1 else box

    def k_box(self, box: Any) -> Any:
        """The k box of box `box` (0 where the boxes run along the rows only)."""
        return box // self.row_boxes if self.k_boxes > 1 else 0

    def origin(self, row0: Any, k: Any, box: Any) -> tuple[Any, Any]:
        """The box's coordinates in the tensor map, innermost first."""
        row = row0 + self.row_box(box) * self.box_rows
        if self.k_boxes > 1:
            k = k + self.k_box(box) * self.box_k
        return (row, k) if self.mn_major else (k, row)

    def landing(self, box: Any) -> Any:
        """The byte of the stage's tile where box `box` lands (the boxes one after another)."""
        return box * self.box_bytes

    def bytes_into(self, rank: int) -> int:
        """The bytes a k tile's boxes of this operand bring into the block of rank `rank`."""
        if not self.mask:
            return self.boxes * self.box_bytes
        return sum(self.box_bytes for j in range(self.boxes) for q in range(self.cluster) if self.lands_in(j, rank, q))


@dataclass(frozen=True)
class MbarrierRing:
    """The TMA/mbarrier ring of a warp-specialised wgmma kernel (see the module's docstring)."""

    stages: int
    full_arrivals: int  # arrivals completing a `full` phase: 1 (TMA only) or the 128 producer threads
    empty_arrivals: int  # arrivals completing an `empty` phase: every consumer warpgroup of the cluster
    consumers: int  # consumer warpgroups per block
    cluster: int  # blocks sharing B's tile; a consumer releases a stage in each of them
    expect_tx: int  # bytes a `full` phase expects (the TMA boxes landing in the block)
    loads: tuple[TmaOperandLoad, ...]  # the TMA operands (others are copied by the producer threads)
    producer_arrivals: int = 1  # arrivals the producer makes per k tile: its one TMA thread, or all 128
    producer_parity: int = 1  # the producer waits `empty` with parity phase ^ 1
    consumer_parity: int = 0  # the consumers wait `full` with parity phase ^ 0
    # the ring's state update after each k tile (`advance`, printed as habu::ring_advance<wrap[, flip]>):
    # the stage index wraps to 0 when it reaches `wrap` (wgmma_ring: the stages), flipping the phase by `flip`
    wrap: int = 0
    flip: int = 1
    start_stage: int = 0  # the state the ring starts from (the kernel's `int stage`, `u32 phase`)
    start_phase: int = 0
    # where stage s's barriers sit, in bytes from the ring's first (`bars`): full at barrier_stride·s, empty
    # empty_offset bytes after it, as habu::ring_init initialises them (habu/sync/mbarrier.cuh; other
    # values only in planted bugs, which habu.prove.pipeline refuses)
    barrier_stride: int = 16
    empty_offset: int = 8
    base: int = 0  # bytes from the aligned shared-memory base to the first barrier (the layout's `bar` buffer)
    # B ahead (the plan's `b_ahead`; A's with `a_ahead`: `ahead_side`): for each output tile the producer first
    # issues that operand's boxes of the tile's first `ahead` k tiles (waiting each stage's `empty` phase,
    # posting their bytes, no arrival), then runs its k loop from the tile's first k tile again: there each of
    # those tiles gets the rest of its fill (the other operand's boxes or copies, the arrivals), the later ones
    # the whole fill. 0: every fill whole.
    ahead: int = 0
    ahead_side: str = "B"
    # consumer lag (the plan's `consumer_lag`): consumer c ≥ 1 starts an output tile's k loop once consumer c − 1
    # has multiplied min(lag, k tiles of the tile) of its k tiles (a named barrier, `lag_barrier`), so the
    # warpgroups' epilogues do not coincide. 0: the consumers run in step
    lag: int = 0
    lag_barrier_base: int = 8  # consumer c waits on named barrier base + c − 1 (above the epilogues' 1..5)

    def lag_barrier(self, c: Any) -> Any:
        """The named barrier consumer c waits on (and consumer c − 1 arrives at)."""
        return self.lag_barrier_base + c - 1

    def lag_tiles(self, n: Any) -> Any:
        """The k tiles consumer c − 1 multiplies of an output tile of `n` k tiles before consumer c starts it."""
        from habu.lower.access import minimum

        return minimum(n, self.lag)

    def stage(self, t: Any) -> Any:
        """The stage of the block's k tile t."""
        return t % self.stages

    def phase(self, t: Any) -> Any:
        """The parity of the ring's pass over its stages at k tile t."""
        return (t // self.stages) % 2

    def producer_wait(self, phase: Any) -> Any:
        return phase ^ self.producer_parity if self.producer_parity else phase

    def consumer_wait(self, phase: Any) -> Any:
        return phase ^ self.consumer_parity if self.consumer_parity else phase

    def full_barrier(self, bars: Any, stage: Any) -> Any:
        """The address of stage `stage`'s full barrier (`bars`: the ring's first barrier)."""
        return bars + self.barrier_stride * stage

    def empty_barrier(self, bars: Any, stage: Any) -> Any:
        return self.full_barrier(bars, stage) + self.empty_offset

    def read_slot(self, stage: Any) -> Any:
        """The stage a consumer reads when the ring is at `stage`."""
        return stage

    def advance(self, stage: int, phase: int) -> tuple[int, int]:
        """The (stage, phase) after one k tile: what `habu::ring_advance<wrap, flip>` computes
        (`if (++stage == wrap) { stage = 0; phase ^= flip; }`), run by habu.prove.pipeline."""
        stage += 1
        if stage == self.wrap:
            return 0, phase ^ self.flip
        return stage, phase

    def load(self, side: str) -> TmaOperandLoad | None:
        return next((ld for ld in self.loads if ld.side == side), None)

    @property
    def behind_side(self) -> str:
        """The operand that fills the stages the ahead boxes went into (the other one)."""
        return "A" if self.ahead_side == "B" else "B"

    def ahead_start(self, stage: Any, phase: Any) -> tuple[Any, Any]:
        """The (stage, phase) the boxes ahead start from, the ring at an output tile's first k tile being at
        (stage, phase): the same (printed as `stage_ahead = stage`, run by habu.prove.pipeline)."""
        return stage, phase

    @property
    def ahead_bytes(self) -> int:
        """The bytes the boxes ahead bring a stage (posted ahead; the rest of `expect_tx` with the fill's rest)."""
        ld = self.load(self.ahead_side)
        return ld.bytes_into(0) if ld is not None and self.ahead else 0


@dataclass(frozen=True)
class CpAsyncRing:
    """The cp.async ring of the mma.sync path: tile t of the block's k tiles in stage t mod S; the
    prologue commits `prologue` tiles; iteration j waits until at most `wait_groups` commit groups
    are in flight before reading its stage."""

    stages: int
    prologue: int
    wait_groups: int

    def stage(self, t: Any) -> Any:
        return t % self.stages


Pipeline = MbarrierRing | CpAsyncRing


def wgmma_ring(stages: int, consumers: int, cluster: int, bm: int, bn: int, bk: int, k_step: int,
               moves: dict[str, str], b_mn: bool, element_bytes: int, a_mn: bool = False) -> MbarrierRing:
    """The ring of the wgmma path: A by TMA in one box of BK × BM (K-major) or in BM/64 boxes of 64
    columns (MN-major: A stored [k m]); B in one box (K-major), in BN/64 boxes of 64 columns (MN-major),
    and in a cluster split among the blocks and multicast."""
    loads = []
    for side, rows in (("A", bm), ("B", bn)):
        if moves[side] != "tma":
            continue
        multicast = side == "B" and cluster > 1
        mn_major = b_mn if side == "B" else a_mn
        k_boxes = 1
        if mn_major:  # (a box of 64 columns holds the whole k tile: up to 256 rows of k)
            box_rows, box_k, boxes = MN_BLOCK, bk, rows // MN_BLOCK
        elif multicast:
            box_rows, box_k, boxes = bn // cluster, bk, cluster
        elif bk * element_bytes > SPAN_BYTES:  # K-major, longer than a swizzle span: boxes along k
            k_boxes = bk * element_bytes // SPAN_BYTES
            box_rows, box_k, boxes = rows, SPAN_BYTES // element_bytes, k_boxes
        else:
            box_rows, box_k, boxes = rows, bk, 1
        loads.append(TmaOperandLoad(side, mn_major, box_rows, box_k, boxes, element_bytes,
                                    cluster if multicast else 1, (1 << cluster) - 1 if multicast else 0,
                                    k_step, bk, k_boxes))
    all_tma = all(m == "tma" for m in moves.values())
    tx = sum(ld.bytes_into(0) for ld in loads)
    arrivals = 1 if all_tma else 128
    return MbarrierRing(stages, arrivals, consumers * cluster, consumers, cluster, tx, tuple(loads), arrivals,
                        wrap=stages)


def cp_async_ring(stages: int) -> CpAsyncRing:
    return CpAsyncRing(stages, stages - 1, stages - 2)


__all__ = ["MN_BLOCK", "CpAsyncRing", "MbarrierRing", "Pipeline", "TmaOperandLoad", "cp_async_ring", "wgmma_ring"]


def lag_refusal(kernel: Any, lag: int) -> str | None:
    """Why a consumer lag of `lag` k tiles cannot stagger `kernel`'s consumers, or None: the wgmma ring's consumer
    warpgroups (two or more), unsplit, unclustered, at most `stages` k tiles behind. The supported-path rule, the
    pins and the search read this one answer."""
    from habu.lower.registers import consumer_warpgroups

    if str(kernel.mma) != "wgmma" or consumer_warpgroups(kernel.warps, kernel.warp_specialized) < 2 \
            or kernel.split_k > 1 or kernel.cluster_m > 1:
        return "consumer_lag: two or more wgmma consumer warpgroups, no split-K or cluster"
    if lag > kernel.stages:
        return (f"consumer_lag={lag}: at most the ring's {kernel.stages} stages (the first warpgroup would wait for "
                "stages the second has not released)")
    return None


def lag_phases_apart(k_tiles: Any, lag: int, stages: int) -> Any:
    """Whether a persistent block's lagged consumers never mix two tiles' phases of their named barrier: a tile's k
    tiles n and the lag's min(n, lag) exceed the stages the ring lets the first warpgroup run ahead (ints or z3)."""
    from habu.lower.access import minimum

    return k_tiles + minimum(k_tiles, lag) > stages


def pipeline_for(kernel: Any, a_dtype: str, b_last_axis: str, a_last_axis: str = "k",
                 b_dtype: str | None = None) -> Pipeline | None:
    """The pipeline a contraction kernel's k loop runs: the mbarrier ring (wgmma, its barriers where the
    shared-memory layout puts them), the cp.async ring (mma.sync), or none (the SIMT path loads each
    tile and synchronises)."""
    from dataclasses import replace

    from habu.lower.registers import consumer_warpgroups
    from habu.lower.smem import tensor_core_smem
    from habu.spec.dtypes import DTYPES

    mma = str(kernel.mma)
    if mma == "mma.sync":
        return cp_async_ring(kernel.stages)
    if mma != "wgmma":
        return None
    moves = {side: ("tma" if str(m) == "staged" else str(m)) for side, m in (("A", kernel.a_move), ("B", kernel.b_move))}
    ring = wgmma_ring(kernel.stages, consumer_warpgroups(kernel.warps, kernel.warp_specialized), max(1, kernel.cluster_m),
                      kernel.tile_m, kernel.tile_n, kernel.tile_k, kernel.tile_k, moves, b_last_axis == "n",
                      DTYPES[a_dtype].bytes, a_last_axis == "m")
    layout = tensor_core_smem(kernel, a_dtype, b_dtype or a_dtype, b_last_axis == "k")
    bars = next((b.offset for b in layout.buffers if b.name == "bar"), 0)
    side = "A" if getattr(kernel, "a_ahead", False) else "B" if getattr(kernel, "b_ahead", False) else ""
    ahead = kernel.stages if side and ring.load(side) is not None and ring.cluster == 1 else 0
    hints = l2_hints(kernel)
    ring = replace(ring, loads=tuple(replace(ld, l2_hint=L2Hint.NONE if ld.mask else hints[ld.side])
                                     for ld in ring.loads))
    return replace(ring, base=bars, ahead=ahead, ahead_side=side or "B", lag=getattr(kernel, "consumer_lag", 0))
