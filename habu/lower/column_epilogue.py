"""A column sum in a contraction's epilogue, as data: `G[n] = Σ m V[m n]` of the chain's end V, computed by
the kernel that computes V when one tile row holds every row of m (a bias gradient `dB1[one h] = Σ b dT2[b h]`
beside the 128-token FFN backward's `dT2`, whose 128 × 128 tiles hold all 128 tokens).

Per tile, each consumer thread adds up the values it holds of each of its columns (the accumulator fragment's
rows, `habu.lower.fragments`, over its slabs and row halves; rows past #M masked), then

    v += shfl_xor(v, x)                  for x in `shuffles`: the lanes holding one column combine
    lanes < `writers` store v at slot(cw, warp, column)      (bytes from smem_base, in the TMA-store buffers)
    every consumer thread t < BN: G = Σ over warpgroups cw', warps w' of slot(cw', w', t);
        out[n0 + t] = finish(G)          (masked n0 + t < #N)

    slot(cw, warp, column) = base + cw·warpgroup_stride + (warp·BN + column)·4

Where the tiles of m may be several (`combine`), the finishing threads store their block's sums instead, at
`partial_offset(tm, n)` of a workspace of the launch (tm·#N + n: plain stores, each slot once), and the block
counts itself on its column tile's counter (`counter_slot(tn)`, a second workspace, zero-filled once when the
runtime allocates it); the block that brings the count to `arrivals` (the tiles of m) adds every tile row's
sums of its columns, finishes and stores them, and leaves the counter at `counter_after` (0) for the next
launch, as the split-KV decode's combining block does.

The emitter prints these numbers; the finite-field check (`habu.prove.column_epilogue`) runs the same map
thread by thread, so a shuffle that misses a lane, a writer too many, slots that overlap or a padding row
summed fails on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from habu.lower.access import Access, access_for, size_of
from habu.lower.tma_store import TmaStoreEpilogue
from habu.plan.patterns import column_parts, epilogue_column, inline_nodes
from habu.spec.ir import Expr, Extent, IndexConst, IndexVar, Load, Model, Reduce, map_ops, rename_vars

COLUMN_SUM = "%colsum"  # the column's sum, as the finish expression names it
SLOT_BYTES = 4  # an f32 partial


@dataclass(frozen=True)
class EpilogueColumnSum:
    nodes: tuple[str, ...]  # the model's column nodes the kernel computes (the sum, then its column epilogue)
    finish: Expr  # the stored value, over Load(COLUMN_SUM, ())
    out: Access  # where it is stored: positions over "n", size-1 positions at 0 (a bias's broadcast shape)
    bn: int = 0  # columns of the tile (the kernel's tile_n)
    consumers: int = 0  # consumer warpgroups
    warps: int = 4  # warps of a warpgroup
    base: int = 0  # bytes from smem_base to warpgroup 0's partials (its TMA-store buffers, after its last box)
    warpgroup_stride: int = 0  # bytes from one warpgroup's partials to the next one's
    region: int = 0  # bytes a warpgroup's partials may take (its TMA-store buffers)
    shuffles: tuple[int, ...] = (4, 8, 16)  # the xor masks combining the lanes of one column (lane / 4 varies)
    writers: int = 4  # lanes below it store their warp's sums (one lane per column pair)
    mask_rows: bool = True  # rows past #M add nothing (False only in planted bugs)
    # what is summed: None, the chain's end (the epilogue's value); else one of the epilogue's loads at the element
    # (Load over the axes m and n: `dB2 = Σ b dT6[b d]` beside `dX = dT6 + …`)
    summand: Load | None = None
    m: Extent | None = None  # the extent summed over (its size, or its runtime range)
    n: str = ""  # the extent of n (the workspace's row length)
    combine: bool = False  # the tiles of m may be several: each block's sums meet in the launch's workspace
    m_tile: str = ""  # the workspace's tile rows as an extent token ("M/64": ⌈#M / BM⌉)

    @property
    def partials_tensor(self) -> str:
        """The workspace of the tile rows' sums (named after the output, which no other kernel writes)."""
        return f"${self.out.tensor}.sums"

    @property
    def counters_tensor(self) -> str:
        return f"${self.out.tensor}.count"

    def partial_offset(self, tm: Any, n: Any, sizes: Mapping[str, Any]) -> Any:
        """Where tile row tm keeps its sum of column n (elements from the workspace's start)."""
        return tm * sizes[self.n] + n

    def counter_slot(self, tn: Any) -> Any:
        """The counter column tile tn's blocks count themselves on."""
        return tn

    def arrivals(self, sizes: Mapping[str, Any]) -> Any:
        """Blocks that count themselves on a column tile's counter: its tiles of m; the one bringing the count to
        this finishes the tile's columns."""
        return size_of(self.m_tile, sizes)

    def counter_after(self) -> int:
        """What the finishing block leaves in its counter: 0, so that the next launch finds it zero (the runtime
        zero-fills the counters once, when it allocates them: `CudaKernel.zero_once`)."""
        return 0

    def slot(self, cw: Any, warp: Any, column: Any) -> Any:
        """Bytes from smem_base to warp `warp` of warpgroup cw's partial of the tile's column `column`."""
        return self.base + cw * self.warpgroup_stride + (warp * self.bn + column) * SLOT_BYTES

    @property
    def finishers(self) -> int:
        """The consumer threads that finish columns: every one (128 a warpgroup)."""
        return 128 * self.consumers

    @property
    def finisher_rounds(self) -> int:
        """Columns each finishing thread takes in turn (a tile wider than the consumer threads takes two)."""
        return -(-self.bn // max(1, self.finishers))

    def register(self, j: Any, q: Any) -> Any:
        """The element of the thread's running sums (`colsum[]`) that keeps its column q of 8-column group j."""
        return 2 * j + q

    def registers(self, groups: int) -> int:
        """The running sums a thread declares for a tile of `groups` 8-column groups (one past the last register)."""
        return int(self.register(groups - 1, 1)) + 1

    def finisher_column(self, t: Any, i: Any = 0) -> Any:
        """The tile's column consumer thread t (0 .. finishers − 1) sums and stores in round i, when below `bn`."""
        return t + i * self.finishers

    @property
    def partial_bytes(self) -> int:
        """Bytes of one warpgroup's partials."""
        return self.warps * self.bn * SLOT_BYTES


def column_sum_for(model: Model, nodes: tuple[str, ...], storage: Mapping[str, str] | None = None
                   ) -> EpilogueColumnSum:
    """The column nodes' sum and finish (`habu.plan.column_epilogue.summed_tensor` holds): the finish is the
    column epilogue inlined over the sum, stored at the column along n and at 0 along size-1 extents."""
    red, epilogue = column_parts(model, nodes)
    last = epilogue[-1] if epilogue else red
    column = epilogue_column(model, last) if epilogue else red.lhs[0]
    if not isinstance(column, IndexVar):
        raise ValueError(f"{last.target} is not stored one value a column")
    n = IndexVar("n", column.extent)
    finish: Expr = Load(red.target, (column,))
    if epilogue:
        finish = inline_nodes(last.rhs, {e.target: e for e in epilogue[:-1]})
    finish = _sum_named(rename_vars(finish, {column: n}), red.target)
    index = tuple(n if v == column else IndexConst(0) for v in last.lhs)
    out = access_for(model.tensor(last.target), index, {n: "n"}, {"n": column.extent}, storage)
    assert isinstance(red.rhs, Reduce)
    return EpilogueColumnSum(tuple(nodes), finish, out, m=model.extent(red.rhs.vars[0].extent), n=column.extent)


def _sum_named(expr: Expr, target: str) -> Expr:
    """`expr` with each load of the sum node replaced by the column's sum (`COLUMN_SUM`)."""
    return map_ops(expr, lambda e: Load(COLUMN_SUM, ()) if isinstance(e, Load) and e.tensor == target else e)


def placed(cs: EpilogueColumnSum | None, st: TmaStoreEpilogue | None, bn: int, bm: int) -> EpilogueColumnSum | None:
    """The column sum at a schedule: its partials in the TMA-store buffers of each warpgroup (none where the
    kernel has none: such a plan is refused, `supported-path`), and the tile rows' sums in the launch's workspace
    unless every size of m fits one tile."""
    if cs is None:
        return None
    m = cs.m
    assert m is not None
    one_row = (m.size if m.size is not None else m.hi) <= bm
    cs = replace(cs, combine=not one_row, m_tile=f"{m.name}/{bm}")
    if st is None:
        return replace(cs, bn=bn, consumers=0, base=0, warpgroup_stride=0, region=0)
    return replace(cs, bn=bn, consumers=st.consumers, base=st.base, warpgroup_stride=st.warpgroup_stride,
                   region=st.warpgroup_stride if st.consumers > 1 else st.buffers * st.buffer_stride)


def schedule_refusal(kernel: Any) -> str | None:
    """Why a schedule cannot compute a column sum in its epilogue whatever the sum (the search's region space skips
    such schedules), or None."""
    if kernel.mma != "wgmma" or kernel.store != "tma" or not kernel.warp_specialized:
        return "a column sum in the epilogue needs the warp-specialised wgmma path's TMA-store buffers"
    if kernel.split_k > 1 or kernel.swap_ab or kernel.cluster_m > 1:
        return "a column sum in the epilogue needs whole, untransposed tiles (no split-K, swap_ab or cluster)"
    return None


def column_sum_refusal(cs: EpilogueColumnSum, kernel: Any) -> str | None:
    """Why the wgmma path's epilogue cannot compute the column sum at this schedule, or None."""
    if (refused := schedule_refusal(kernel)) is not None:
        return refused
    if cs.consumers < 1 or cs.partial_bytes > cs.region:
        return f"the column sum's partials ({cs.partial_bytes} bytes a warpgroup) exceed its TMA-store buffers"
    return None


__all__ = ["COLUMN_SUM", "EpilogueColumnSum", "column_sum_for", "column_sum_refusal", "placed", "schedule_refusal"]
