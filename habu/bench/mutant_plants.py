"""Planted lowerings of the column and grouped families for the mutation suite (habu.bench.mutants):
each takes the lowering the check runs and returns it with one map, mask or count wrong."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace

from habu.lower import ColumnLowering, Lowering
from habu.lower.grouped import GroupedLowering


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
    cls = type("Planted_w_box_origin", (type(lw.wgmma),),
               {"w_box_origin": lambda self, g, n0, k0: {"g": g + 1, "n": n0, "k": k0}})
    return replace(lw, wgmma=cls(**{f.name: getattr(lw.wgmma, f.name) for f in fields(lw.wgmma)}))


def group_end_unmasked(lw: GroupedLowering) -> GroupedLowering:
    """Rows past the group's end (the next groups' rows) loaded and stored by the tile: no row_inside mask."""
    cls = type("Planted_row_inside", (GroupedLowering,), {"row_inside": lambda self, row, end: row < row + 1})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})
