"""Lowering the grouped-GEMM family: `T[r n] = scale · Σ k A[IX[r] k] · W[E[r] n k]` with E a grouping (the
rows of each group contiguous, in order; a group may be empty), in one launch over every group's tiles.

The group offsets: `offs[g] = lower_bound(E, g)` for g in 0..#G (a binary search per group over E's
values, `lower_bound`), found by each block at its start (no host round trip). The tile scheduler:
group g has `m_tiles(offs[g], offs[g + 1])` = ⌈(offs[g+1] − offs[g]) / bm⌉ row tiles (an empty group
none); `tile_starts` is their prefix sum; block (mt, nt) = (blockIdx.x, blockIdx.y) takes the mt-th row
tile of all groups (`decode`: the last group whose start is ≤ mt, its row tile m = mt − start) and the
column tile nt; a block past the last row tile (`live`) does nothing. Its rows `row(offs[g], m, i)` =
offs[g] + m·bm + i are masked by `row_inside` (< offs[g+1]), its columns `column(nt, j)` = nt·bn + j by
#N, its k steps `k_index(step, kk)` by #K. The grid's x is `grid`'s bound on the row tiles of any
grouping: Σ_g ⌈c_g / bm⌉ ≤ ⌊(#R + #G·(bm − 1)) / bm⌋. The weights are read at W[g n k], the tile's
group: equal to W[E[r] n k] for each of its rows because E is grouped (the `grouped` obligation).

The forms beyond the plain GEMM (built when the search or `--pin family=grouped` picks them): a row factor
`P[r]` (`row_scale`, read per row in the epilogue, multiplied after the constant `scale`); a scatter-add
store `T[IX[r] n] += …` (`store` ATOMIC_ADD: the output access's row is the gather IX[r], each value added
with f32 atomicAdd, so rows whose IX repeat accumulate and T keeps its prior contents); an f32 A
(`a_parts` 2: each element staged as two bf16 parts hi = bf16(a), lo = bf16(a − hi), both multiplied
with W's bf16 element, |a − hi − lo| ≤ 2^−17·|a|; the field check runs the exact product a·w, a GPU test
checks the split with values bf16 cannot hold).

A pair (`pair`, a `PairEpilogue`; the kernel's nodes are gate, up and act, `--pin pair=fused`): a second
grouped GEMM of the same A rows with its own weights (`pair.w`, staged beside W) into a second
accumulator, and the elementwise node of both (SwiGLU) computed from the two in the epilogue; only its
result is stored.

Every one of these maps is a method here: the finite-field interpreter (habu.prove.interp_grouped) runs
them, the rules (habu.prove.rules_grouped) bound them, the emitter (habu.emit_cuda.emit_grouped) prints them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from habu.lower.access import Access, VectorAccess, access_for, cdiv, floordiv
from habu.lower.general import Store
from habu.lower.grouped_mma import GroupedMmaLoop, grouped_mma_loop
from habu.lower.grouped_wgmma import WgmmaMainLoop, wgmma_consumers, wgmma_main_loop
from habu.lower.quad_vectors import QuadVectors, quad_vectors
from habu.plan.grouped_pair import as_grouped_pair
from habu.plan.grouped_pattern import as_grouped_gemm
from habu.plan.plan import GroupedKernel
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Equation, Expr, IndexVar, Model


@dataclass(frozen=True)
class PairEpilogue:
    """The second GEMM of a pair, `second` = scale · Σ k A·W2[g], and the node of both: the kernel stores
    `node.rhs` with its loads of `first` read from the first accumulator and of `second` from this one."""

    w: Access  # the second weights at axes (g, n, k)
    scale: Expr | None
    first: str  # the first GEMM's target (gate)
    second: str  # this GEMM's target (up)
    second_node: Equation
    node: Equation  # the elementwise node (act), at its own (r, n)


@dataclass(frozen=True)
class GroupedLowering:
    kernel: GroupedKernel
    r: str  # the rows' extent (#R)
    n: str  # the columns' extent
    k: str  # the reduced extent
    g: str  # the groups' extent (E's values, W's first dimension)
    node: Equation
    a: Access  # A at axes (r, k), its rows gathered or not
    w: Access  # W at axes (g, n, k): the tile's group's slab
    out: Access  # T at axes (r, n)
    groups: str  # the grouping E, read at a row by the offset search
    scale: Expr | None
    index_width: int
    row_scale: Access | None = None  # P at axis r: a factor of each row, multiplied in the epilogue
    store: Store = Store.WRITE  # ATOMIC_ADD: the scatter-add epilogue (T[IX[r] n] += …)
    pair: PairEpilogue | None = None  # a second GEMM and the node of both (SwiGLU in the epilogue)
    # the wgmma main loop (`main_loop = "wgmma"`: habu/lower/grouped_wgmma.py), None for mma.sync or where
    # its maps do not exist (the rules then refuse the plan)
    wgmma: WgmmaMainLoop | None = None
    # the mma.sync main loop's tiles, copies, operand words and accumulator map (habu/lower/grouped_mma.py)
    mma: GroupedMmaLoop | None = None

    @property
    def uses_wgmma(self) -> bool:
        return self.kernel.main_loop == "wgmma"

    @property
    def weights_width(self) -> int:
        """The index width W's (and a pair's second weights') element offsets are formed in: the kernel's on
        the mma.sync loop, whose threads compute them; 64 on the wgmma loop, where the threads give TMA only
        the box's coordinates (`WgmmaMainLoop.w_box_coordinates`, each a 32-bit int below its extent) and
        the copy engine forms the addresses (DeepSeek-V3's 3.8·10^9-element weights in a 32-bit kernel)."""
        return 64 if self.uses_wgmma else self.index_width

    @property
    def w_n_major(self) -> bool:
        """W stored [g k n] (its rows along n contiguous): the wgmma loop reads it in 64-column boxes."""
        return self.w.positions[-1].axis == "n"

    @property
    def a_parts(self) -> int:
        """bf16 parts each element of A is staged as: 1 (A is bf16), 2 (f32 A: hi and lo)."""
        return 1 if self.a.dtype == "bf16" else 2

    @property
    def nodes(self) -> tuple[Equation, ...]:
        return (self.node,) if self.pair is None else (self.node, self.pair.second_node, self.pair.node)

    @property
    def extents(self) -> tuple[str, ...]:
        return (self.r, self.n)

    @property
    def threads(self) -> int:
        """mma.sync: the warps of the tile; wgmma: a producer warpgroup and the consumer warpgroups."""
        if self.uses_wgmma:
            return 128 * (wgmma_consumers(self.kernel) + 1)
        return 32 * self.kernel.warps_m * self.kernel.warps_n

    @property
    def warp_rows(self) -> int:
        return self.kernel.bm // self.kernel.warps_m

    @property
    def warp_cols(self) -> int:
        return self.kernel.bn // self.kernel.warps_n

    # -- the offsets (ints, numpy arrays or C text through `ops`)
    def search_steps(self, rows: int) -> int:
        """Halvings of the binary search over `rows` rows until its range is empty: ⌈log2(rows + 1)⌉."""
        return max(1, int(rows).bit_length())

    def lower_bound(self, value_at: Callable[[Any], Any], g: Any, rows: int, where: Callable[[Any, Any, Any], Any]
                    ) -> Any:
        """The first row whose group is ≥ g (#R when none): lo/hi halved `search_steps` times; `value_at(mid)`
        reads E (only where lo < hi), `where(c, x, y)` selects."""
        lo: Any = g * 0
        hi: Any = g * 0 + rows
        for _ in range(self.search_steps(rows)):
            mid = (lo + hi) // 2
            going = (lo < hi) & (value_at(mid) < g)
            lo, hi = where(going, mid + 1, lo), where(going | ~(lo < hi), hi, mid)
        return lo

    def m_tiles(self, lo: Any, hi: Any) -> Any:
        """Row tiles of the group whose rows are lo .. hi − 1 (none when it is empty)."""
        return cdiv(hi - lo, self.kernel.bm)

    def grid(self, sizes: Mapping[str, Any]) -> tuple[Any, Any]:
        """(row tiles of any grouping at most, column tiles): Σ_g ⌈c_g/bm⌉ ≤ ⌊(#R + #G·(bm−1))/bm⌋."""
        bm = self.kernel.bm
        return floordiv(sizes[self.r] + sizes[self.g] * (bm - 1), bm), cdiv(sizes[self.n], self.kernel.bn)

    def decode(self, mt: Any, starts: list[Any], where: Callable[[Any, Any, Any], Any]) -> tuple[Any, Any]:
        """(group, row tile within it) of the mt-th row tile: the last group whose start is ≤ mt."""
        group: Any = mt * 0
        for gi in range(1, len(starts) - 1):
            group = where(starts[gi] <= mt, gi, group)
        return group, self.tile_in_group(mt, _pick(starts, group, where))

    def block_tile(self, bx: Any, by: Any) -> tuple[Any, Any]:
        """(row tile, column tile) of block (blockIdx.x, blockIdx.y) of the mma.sync loop's grid."""
        return bx, by

    def group_end(self, g: Any) -> Any:
        """The entry of the offsets where group g's rows end (its first row: entry g)."""
        return g + 1

    def tile_in_group(self, mt: Any, start: Any) -> Any:
        """The row tile within its group of the mt-th row tile, its group's tiles starting at `start`."""
        return mt - start

    def live(self, mt: Any, total: Any) -> Any:
        """A block with a row tile to compute (mt below the total row tiles)."""
        return mt < total

    def row(self, begin: Any, m: Any, i: Any) -> Any:
        return begin + m * self.kernel.bm + i

    def row_inside(self, row: Any, end: Any) -> Any:
        return row < end

    def column(self, nt: Any, j: Any) -> Any:
        return nt * self.kernel.bn + j

    def k_index(self, step: Any, kk: Any) -> Any:
        return step * self.kernel.bk + kk

    def k_steps(self, sizes: Mapping[str, Any]) -> Any:
        return cdiv(sizes[self.k], self.kernel.bk)

    @property
    def epilogue_pairs(self) -> bool:
        """The wgmma loop's epilogue stores a thread's two adjacent columns (r, n), (r, n + 1) as one vector
        where both are inside and the pair's offset is even: an output contiguous along n, stored in f32,
        bf16 or f16, or added into f32 (a scatter: one 8-byte vector atomic add, sm_90)."""
        last = self.out.positions[-1]
        dtypes = ("f32", "bf16", "f16") if self.store is Store.WRITE else ("f32",)
        return self.uses_wgmma and self.out.dtype in dtypes and last.kind == "axis" and last.axis == "n"

    @property
    def epilogue_quads(self) -> bool:
        """The wgmma loop's 4-wide epilogue (`store_vector` 4): an f32 output contiguous along n, no pair; two
        neighbouring lanes trade pairs (`WgmmaMainLoop.quad_element`) and each stores (or adds, a scatter: one
        16-byte vector atomic add) four adjacent columns of one row where all four are inside and aligned."""
        return self.epilogue_pairs and self.kernel.store_vector == 4 and self.out.dtype == "f32" and self.pair is None

    @property
    def epilogue_vectors(self) -> QuadVectors | None:
        """The wgmma loop's 16-byte epilogue (`store_vector` 8): a bf16 or f16 output written along n (a pair's
        too: its node's values are traded); the 4 lanes of an accumulator row trade column pairs
        (habu/lower/quad_vectors.py) and each stores 8 adjacent columns of one row where all are inside and the
        vector's offset is aligned, else those inside one at a time. None: the pairs (or fours)."""
        if not (self.epilogue_pairs and self.kernel.store_vector == 8 and self.store is Store.WRITE
                and self.out.dtype in ("bf16", "f16") and self.wgmma is not None):
            return None
        return quad_vectors(self.wgmma.column_groups(), DTYPES[self.out.dtype].bytes, self.wgmma.fragment)

    def vector_accesses(self) -> tuple[VectorAccess, ...]:
        """The 16-byte chunks of A's and W's rows the kernel stages, and the epilogue's pairs (or fours): the
        launch checks their bases' alignment."""
        staged = (self.a, self.w) if self.pair is None else (self.a, self.w, self.pair.w)
        qv = self.epilogue_vectors
        width = qv.elements if qv is not None else 4 if self.epilogue_quads else 2
        pairs = (VectorAccess(self.out.tensor, width, f"the epilogue stores {width} adjacent {self.out.tensor} "
                              "elements as one vector"),) if self.epilogue_pairs else ()
        return tuple(VectorAccess(acc.tensor, 8 if acc.dtype == "bf16" else 4,
                                  f"the plan stages 16-byte chunks ({8 if acc.dtype == 'bf16' else 4} elements) of "
                                  f"{acc.tensor}'s rows") for acc in staged) + pairs

    def smem_bytes(self) -> int:
        """The staged tiles: bm × (bk + 8) of A and bn × (bk + 8) of W in bf16 (rows padded by 16 bytes
        against bank conflicts), A's once per part; the offsets and tile starts (ints, #G + 1 each) are
        counted by the rules."""
        if self.uses_wgmma:
            return self.wgmma.layout.total if self.wgmma is not None else 0
        if self.mma is None:
            return 0
        return self.mma.smem_bytes(self.a_parts, 1 if self.pair is None else 2)

    def dynamic_smem_bytes(self) -> int:
        """Bytes of dynamic shared memory the launch requests: the wgmma loop's stage tiles and barriers."""
        return self.wgmma.layout.total if self.uses_wgmma and self.wgmma is not None else 0


def _pick(values: list[Any], index: Any, where: Callable[[Any, Any, Any], Any]) -> Any:
    """values[index] for a traced index (a select chain: numpy arrays, z3 terms)."""
    if isinstance(index, int):
        return values[index]
    out = values[0]
    for i in range(1, len(values)):
        out = where(index == i, values[i], out)
    return out


def tile_starts(lw: GroupedLowering, offs: list[Any]) -> list[Any]:
    """starts[g] = Σ_{h<g} m_tiles(offs[h], offs[h+1]), g in 0..#G (starts[#G]: every row tile)."""
    starts = [offs[0] * 0]
    for g in range(len(offs) - 1):
        starts.append(starts[-1] + lw.m_tiles(offs[g], offs[g + 1]))
    return starts


def lower_grouped(model: Model, kernel: GroupedKernel, storage: Mapping[str, str] | None = None) -> GroupedLowering:
    if len(kernel.nodes) == 3:
        return _lower_pair(model, kernel, storage)
    if len(kernel.nodes) != 1:
        raise ValueError("a grouped kernel computes one node, or a pair and the node of both")
    eq = next(e for e in model.nodes if e.target == kernel.nodes[0])
    gg = as_grouped_gemm(model, eq)
    if gg is None:
        raise ValueError(f"{eq.target} is not a grouped GEMM")
    gv = IndexVar("g", gg.group_extent)
    axis_of = {gg.r: "r", gg.n: "n", gg.k: "k", gv: "g"}
    extent_of_axis = {"r": gg.r.extent, "n": gg.n.extent, "k": gg.k.extent, "g": gg.group_extent}
    a = access_for(model.tensor(gg.a.tensor), gg.a.indices, axis_of, extent_of_axis, storage)
    w = access_for(model.tensor(gg.w.tensor), (gv, *gg.w.indices[1:]), axis_of, extent_of_axis, storage)
    out = access_for(model.tensor(eq.target), eq.store_indices, axis_of, extent_of_axis, storage)
    row_scale = None if gg.row_scale is None else \
        access_for(model.tensor(gg.row_scale.tensor), gg.row_scale.indices, axis_of, extent_of_axis, storage)
    return GroupedLowering(kernel, gg.r.extent, gg.n.extent, gg.k.extent, gg.group_extent, eq, a, w, out,
                           gg.groups, gg.scale, kernel.index_width, row_scale,
                           Store.WRITE if eq.scatter is None else Store.ATOMIC_ADD,
                           wgmma=wgmma_main_loop(kernel, a, w) if kernel.main_loop == "wgmma" else None,
                           mma=grouped_mma_loop(kernel) if kernel.main_loop != "wgmma" else None)


def _lower_pair(model: Model, kernel: GroupedKernel, storage: Mapping[str, str] | None) -> GroupedLowering:
    """The pair (gate, up, act): the first GEMM's lowering, the second's weights and the node of both,
    stored at act's element (r, n)."""
    pair = as_grouped_pair(model, kernel.nodes)
    if pair is None:
        raise ValueError(f"{' + '.join(kernel.nodes)} is not a pair of grouped GEMMs and a node of both")
    first = replace(kernel, nodes=kernel.nodes[:1])
    base = lower_grouped(model, first, storage)
    g2 = pair.second
    gv = IndexVar("g", g2.group_extent)
    axis_of = {g2.r: "r", g2.n: "n", g2.k: "k", gv: "g"}
    extent_of_axis = {"r": g2.r.extent, "n": g2.n.extent, "k": g2.k.extent, "g": g2.group_extent}
    w2 = access_for(model.tensor(g2.w.tensor), (gv, *g2.w.indices[1:]), axis_of, extent_of_axis, storage)
    epi = pair.epilogue
    out = access_for(model.tensor(epi.target), epi.lhs, {epi.lhs[0]: "r", epi.lhs[1]: "n"}, extent_of_axis, storage)
    wgmma = wgmma_main_loop(first, base.a, base.w, pair=True) if kernel.main_loop == "wgmma" else None
    return replace(base, kernel=kernel, out=out, wgmma=wgmma, mma=grouped_mma_loop(kernel) if wgmma is None and
                   kernel.main_loop != "wgmma" else None,
                   pair=PairEpilogue(w2, g2.scale, pair.first.node.target, g2.node.target, g2.node, epi))
