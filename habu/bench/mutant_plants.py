"""Planted lowerings of the contraction, column and grouped families for the mutation suite (habu.bench.mutants):
each takes the lowering the check runs and returns it with one map, mask or count wrong."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace

from habu.lower import ColumnLowering, ContractionLowering, Lowering
from habu.lower.grouped import GroupedLowering


def stops_early(lw: ContractionLowering) -> ContractionLowering:
    """The same lowering whose k loop ends one tile early (a method, not a field: planted by a subclass)."""

    class StopsEarly(ContractionLowering):
        def k_range(self, split, s):
            begin, end = super().k_range(split, s)
            return begin, end - 1

    return StopsEarly(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def batch_decode_unreduced(lw: ContractionLowering) -> ContractionLowering:
    """The same lowering whose tile within the batch is decoded from the block index itself, not from
    the index less the batch's first block (z · tiles per batch): batches after the first decode tiles
    past the grid."""

    class Unreduced(ContractionLowering):
        def decode(self, linear, s, let=None):
            batch, _tm, _tn, _split = super().decode(linear, s, let)
            return batch, *self.tile_of(linear, s)

    return Unreduced(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def tile_origin_from_bn(lw: ContractionLowering) -> ContractionLowering:
    """The same lowering whose tile rows start at tm·BN (its `tile_origin`, which the emitter prints as m0)."""
    cls = type("Planted_tile_origin", (ContractionLowering,),
               {"tile_origin": lambda self, tm, tn: (tm * self.bn, tn * self.bn)})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def col(f: Callable[[ColumnLowering], ColumnLowering]) -> Callable[[Lowering], Lowering]:
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, ColumnLowering)
        return f(lw)
    return g


def planted(lw: ColumnLowering, method: str, body: Callable) -> ColumnLowering:
    """The same column lowering with one method replaced (planted by a subclass: methods are not fields)."""
    cls = type(f"Planted_{method}", (ColumnLowering,), {method: body})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def partials_transposed(lw: ColumnLowering) -> ColumnLowering:
    """Thread (g, tc) writes its column v's partial at g·W + v·column_threads + tc (the combine reads
    g·W + tc·vector + v): a column's partials land under another column's slot."""
    return planted(lw, "partial_slot",
              lambda self, g, tc, v: g * self.tile + v * self.kernel.column_threads + tc)


def rows_skip_group(lw: ColumnLowering) -> ColumnLowering:
    """The row loop steps by G·U − 1 rows: consecutive iterations overlap by one row (double-counted)."""
    return planted(lw, "row", lambda self, begin, i, u, g:
              begin + i * (self.row_groups * self.kernel.unroll - 1) + u * self.row_groups + g)


def split_end_past(lw: ColumnLowering) -> ColumnLowering:
    """A split's rows end one row late (`row < begin + S + 1`): its neighbour's first row counted twice."""
    from habu.lower.access import minimum

    return planted(lw, "row_end", lambda self, split, sizes:
              minimum(split * self.kernel.rows_per_split + self.kernel.rows_per_split + 1, self.rows(sizes)))


def combine_skips(lw: ColumnLowering) -> ColumnLowering:
    """The combining loop steps by 2·threads where a tile has more slots than threads: every other
    round of slots is never stored."""
    return planted(lw, "combine_step", property(lambda self: 2 * self.kernel.threads))


def vector_overlap(lw: ColumnLowering) -> ColumnLowering:
    """Column threads step by vector − 1 columns: neighbouring threads' vectors overlap (the tile's last
    columns are never read)."""
    return planted(lw, "thread_column", lambda self, tile, tc, v:
              tile * self.tile + tc * (self.kernel.vector - 1) + v)


def columns_decoded_wrong(lw: ColumnLowering) -> ColumnLowering:
    """A 3-D column reduction decodes row r as b = r / #B (the outer extent, not #S), s = r % #S."""
    def row_coordinates(self, r, sizes):
        outer, inner = self.row_axes
        return {outer: r // sizes[self.leading[0]], inner: r % sizes[self.leading[1]]}

    return planted(lw, "row_coordinates", row_coordinates)


def final_pass_skips(lw: ColumnLowering) -> ColumnLowering:
    """A tile's last block's pass over the tile's columns strides 2·threads (the thread map's `final_step`
    doubled): the columns of a tile wider than the block never get their epilogue."""
    return replace(lw, thread_map=replace(lw.thread_map, final_step=2 * lw.thread_map.final_step))


def tiles_rounded_down(lw: Lowering) -> Lowering:
    """The grouped GEMM's tile scheduler counts a group's row tiles as (rows) // bm instead of ⌈rows / bm⌉:
    a group smaller than a tile gets none, and a longer one loses its ragged last tile (rows unwritten)."""
    assert isinstance(lw, GroupedLowering)
    cls = type("Planted_m_tiles", (GroupedLowering,), {"m_tiles": lambda self, lo, hi: (hi - lo) // self.kernel.bm})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def grouped(f: Callable[[GroupedLowering], GroupedLowering]) -> Callable[[Lowering], Lowering]:
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, GroupedLowering)
        return f(lw)
    return g


def box_group_shifted(lw: GroupedLowering) -> GroupedLowering:
    """The wgmma loop's TMA box of W one group past the tile's: W[g + 1]'s rows (zeros past the last group)."""
    assert lw.wgmma is not None
    base = type(lw.wgmma)
    cls = type("Planted_w_box_origin", (base,),
               {"w_box_origin": lambda self, g, n0, k0, box=0: {**base.w_box_origin(self, g, n0, k0, box), "g": g + 1}})
    return replace(lw, wgmma=cls(**{f.name: getattr(lw.wgmma, f.name) for f in fields(lw.wgmma)}))


def quad_partner_two_lanes_away(lw: GroupedLowering) -> GroupedLowering:
    """The 4-wide epilogue trades pairs with the lane two away (lane ^ 2) instead of its neighbour: each lane
    stores, beside its own pair, a pair of the columns four away from where it lands."""
    assert lw.wgmma is not None
    cls = type("Planted_quad_partner", (type(lw.wgmma),),
               {"quad_partner": lambda self, lane: lane + 2 - 4 * ((lane // 2) % 2)})
    return replace(lw, wgmma=cls(**{f.name: getattr(lw.wgmma, f.name) for f in fields(lw.wgmma)}))


def pair_halves_swapped(lw: GroupedLowering) -> GroupedLowering:
    """A fused pair by one instruction (`pair_wgmmas` 1) reads the first product's groups from the
    accumulator's second half and the second's from its first: SwiGLU of up and gate, not gate and up."""
    assert lw.wgmma is not None
    cls = type("Planted_pair_group", (type(lw.wgmma),),
               {"pair_group": lambda self, j, which: j + (1 - which) * self.column_groups()})
    return replace(lw, wgmma=cls(**{f.name: getattr(lw.wgmma, f.name) for f in fields(lw.wgmma)}))


def vector_slot_one_off(lw: GroupedLowering) -> GroupedLowering:
    """The 16-byte epilogue (`store_vector` 8) puts each received pair one slot off (t ^ r ^ 1): every vector
    holds its row's columns, pairwise swapped."""
    qv = lw.epilogue_vectors
    assert qv is not None
    planted = type("Planted_slot", (type(qv),), {"slot": lambda self, lane, r: self.lane_in_group(lane) ^ r ^ 1})(
        **{f.name: getattr(qv, f.name) for f in fields(qv)})
    cls = type("Planted_vectors", (GroupedLowering,), {"epilogue_vectors": property(lambda self: planted)})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def group_end_unmasked(lw: GroupedLowering) -> GroupedLowering:
    """Rows past the group's end (the next groups' rows) loaded and stored by the tile: no row_inside mask."""
    cls = type("Planted_row_inside", (GroupedLowering,), {"row_inside": lambda self, row, end: row < row + 1})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def _planted(obj, method: str, planted):
    """`obj` (a frozen dataclass) with one method's result planted: `planted(the method as it was, *args)`."""
    base = getattr(type(obj), method)
    cls = type(f"Planted_{method}", (type(obj),),
         {method: lambda self, *args: planted(lambda *a: base(self, *a), *args)})
    return cls(**{f.name: getattr(obj, f.name) for f in fields(obj)})


def grouped_mma(f: Callable) -> Callable[[Lowering], Lowering]:
    """A plant in the grouped mma.sync loop's maps (habu/lower/grouped_mma.py)."""
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, GroupedLowering) and lw.mma is not None
        return replace(lw, mma=f(lw.mma))
    return g


def grouped_wgmma_loop(f: Callable) -> Callable[[Lowering], Lowering]:
    """A plant in the grouped wgmma loop's own maps (habu/lower/grouped_wgmma.py)."""
    def g(lw: Lowering) -> Lowering:
        assert isinstance(lw, GroupedLowering) and lw.wgmma is not None
        return replace(lw, wgmma=f(lw.wgmma))
    return g


def a_word_rows_swapped(loop):
    """A's operand registers 0 and 1 (rows lane/4 and lane/4 + 8 of the m16 tile) read each other's row."""
    return replace(loop, a_read=_planted(loop.a_read, "word", lambda sup, r: sup(r ^ 1)))


def copy_turn_shifted(loop):
    """Each thread's q-th copy takes chunk tid + q·threads + 1: chunk 0 is never copied, one past the tile is."""
    return _planted(loop, "chunk", lambda sup, tid, q: sup(tid, q) + 1)


def accumulator_halves_swapped(loop):
    """The epilogue stores registers q and q ^ 2 at each other's element (rows lane/4 and lane/4 + 8)."""
    return _planted(loop, "accumulator", lambda sup, wm, wn, i, j, lane, q: sup(wm, wn, i, j, lane, q ^ 2))


def group_end_one_early(lw: Lowering) -> Lowering:
    """A tile's rows are masked at offs[g] (the group's first row, not offs[g + 1]): none is computed."""
    assert isinstance(lw, GroupedLowering)
    return _planted(lw, "group_end", lambda sup, g: sup(g) - 1)


def block_decode_swapped(lw: Lowering) -> Lowering:
    """The mma.sync grid's block takes its row tile from blockIdx.y and its column tile from blockIdx.x."""
    assert isinstance(lw, GroupedLowering)
    return _planted(lw, "block_tile", lambda sup, bx, by: sup(by, bx))


def consumer_decode_off_by_one(loop):
    """The consumers number themselves by warpgroup (cw = wg, not wg − 1): slabs past the tile, slab 0 never."""
    return _planted(loop, "consumer", lambda sup, wg: wg)


def producer_copy_k_stuck(loop):
    """Every producer thread copies the first 16-byte column of its rows (k 0..7) of each k tile."""
    return _planted(loop, "a_copy_k", lambda sup, ptid: sup(ptid) * 0)


def walk_step_doubled(loop):
    """Each persistent block steps 2·gridDim.x tiles: every other tile of a block's walk is skipped."""
    return _planted(loop, "walk", lambda sup, b, nb, tiles: (*sup(b, nb, tiles)[:2], 2 * sup(b, nb, tiles)[2]))


def wgmma_accumulator_rows_per_warp_halved(loop):
    """The wgmma epilogue takes a warp's rows 8 apart instead of 16: warps 1..3 store over each other."""
    return replace(loop, fragment=replace(loop.fragment, warp_rows=8))


MOE_SMALL = "../tests/data/moe_small.habu"
COMBINE = {"T": 13, "R": 26}  # the MoE combine as a grouped kernel (--pin family=grouped), kernel 3
GROUPED_FAMILY = {"family": "grouped"}
GROUPED_WGMMA = {"family": "grouped", "main_loop": "wgmma"}

# the grouped loops' maps the lowering holds (habu/lower/grouped_mma.py, grouped_wgmma.py), one mutant per class:
# habu.bench.mutants.Mutant's fields (name, bug, example, model, shape, mutate, pins, kernel)
GROUPED_LOOP_MUTANTS: tuple[tuple, ...] = (
    ("grouped-mma-fragment-row-swapped", "the grouped mma.sync loop's A registers 0 and 1 read each other's "
     "row (lane/4 and lane/4 + 8)", MOE_SMALL, "MOE-FFN", COMBINE, grouped_mma(a_word_rows_swapped),
     GROUPED_FAMILY),
    ("grouped-mma-copy-chunk-shifted", "each thread of the grouped mma.sync loop copies chunk tid + q·threads "
     "+ 1: A's first chunk is never staged", MOE_SMALL, "MOE-FFN", COMBINE, grouped_mma(copy_turn_shifted),
     GROUPED_FAMILY),
    ("grouped-mma-accumulator-halves-swapped", "the grouped mma.sync epilogue stores registers q and q ^ 2 at "
     "each other's rows", MOE_SMALL, "MOE-FFN", COMBINE, grouped_mma(accumulator_halves_swapped),
     GROUPED_FAMILY, 3),
    ("grouped-group-end-one-entry-early", "the grouped combine masks a tile's rows at offs[g] instead of "
     "offs[g + 1]: no row of the group is added", MOE_SMALL, "MOE-FFN", COMBINE, group_end_one_early,
     GROUPED_FAMILY, 3),
    ("grouped-mma-block-decode-swapped", "the grouped mma.sync grid takes the row tile from blockIdx.y and "
     "the column tile from blockIdx.x", MOE_SMALL, "MOE-FFN", COMBINE, block_decode_swapped, GROUPED_FAMILY),
    ("grouped-wgmma-consumer-decode-off-by-one", "the grouped wgmma loop's consumers number themselves cw = wg "
     "(not wg − 1): the first slab is never multiplied", MOE_SMALL, "MOE-FFN", COMBINE,
     grouped_wgmma_loop(consumer_decode_off_by_one), GROUPED_WGMMA),
    ("grouped-wgmma-producer-copies-k-stuck", "the grouped wgmma producer copies the first 16-byte column of "
     "A's rows for every thread", MOE_SMALL, "MOE-FFN", COMBINE, grouped_wgmma_loop(producer_copy_k_stuck),
     GROUPED_WGMMA),
    ("grouped-wgmma-walk-step-doubled", "each persistent block of the grouped wgmma loop steps 2·gridDim.x tiles: "
     "half the tiles are never computed", MOE_SMALL, "MOE-FFN", COMBINE, grouped_wgmma_loop(walk_step_doubled),
     GROUPED_WGMMA),
    ("grouped-wgmma-accumulator-warp-rows-halved", "the grouped wgmma epilogue takes each warp's rows 8 apart "
     "instead of 16", MOE_SMALL, "MOE-FFN", COMBINE, grouped_wgmma_loop(wgmma_accumulator_rows_per_warp_halved),
     GROUPED_WGMMA, 3),
)
