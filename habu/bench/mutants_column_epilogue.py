"""Planted bugs in a column sum computed in a contraction's epilogue (habu/lower/column_epilogue.py: the
product's chain end summed over the tile's rows, `G[n] = Σ m V[m n]`, a bias gradient beside its product).
The emitter prints the shuffles, the writers, the partials' slots, the finishing threads and the row mask from
the lowering's `EpilogueColumnSum`, and the finite-field check runs the same ones
(habu.prove.column_epilogue), so each must be killed (habu.bench.mutants lists them;
tests/prove/test_column_epilogue.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from habu.lower import ContractionLowering, Lowering
from habu.lower.column_epilogue import EpilogueColumnSum

EXAMPLE = "../tests/data/column_epilogue.habu"  # relative to examples/, as habu.bench.mutants reads them
MODEL = "BIASED-COLSUM"
FFN = "ffn_skip.habu"
FFN_SHAPE = {"B": 128, "D": 512, "H": 1024}  # the backward's dT2 product sums dB1 in its epilogue (kernel 1),
FFN_PINS = {"tile": "128x128x64"}  # its 128 × 128 tiles holding every token, as at the layer's own widths


def _sum(lw: Lowering, **changes: Any) -> Lowering:
    assert isinstance(lw, ContractionLowering) and lw.column_sum is not None
    return replace(lw, column_sum=replace(lw.column_sum, **changes))


def shuffle_short(lw: Lowering) -> Lowering:
    """The lanes combine by xor 4 and 8 only: the lanes 16 apart (rows 4 apart) never meet."""
    return _sum(lw, shuffles=(4, 8))


def shuffle_across_pairs(lw: Lowering) -> Lowering:
    """The first shuffle is xor 2, not 4: lanes holding other columns are added in (lane % 4 is the column pair)."""
    return _sum(lw, shuffles=(2, 8, 16))


def load_summed_as_end(lw: Lowering) -> Lowering:
    """The epilogue's value summed where the column sum reads one of its loads (dX summed for dB2, not dT6)."""
    return _sum(lw, summand=None)


def padding_rows_added(lw: Lowering) -> Lowering:
    """The rows past #M in the last tile are summed too (their value is the bias, not zero)."""
    return _sum(lw, mask_rows=False)


def writers_too_many(lw: Lowering) -> Lowering:
    """Lanes 0..7 store their sums: lanes 4..7 hold the same columns and write the same slots."""
    return _sum(lw, writers=8)


@dataclass(frozen=True)
class _WarpsOverlap(EpilogueColumnSum):
    def slot(self, cw: Any, warp: Any, column: Any) -> Any:  # warps half a row of slots apart
        return self.base + cw * self.warpgroup_stride + (warp * (self.bn // 2) + column) * 4


def warp_slots_overlap(lw: Lowering) -> Lowering:
    """Each warp's partials start half a tile row after the previous warp's: two warps write one slot."""
    assert isinstance(lw, ContractionLowering) and lw.column_sum is not None
    return replace(lw, column_sum=_WarpsOverlap(**vars(lw.column_sum)))


@dataclass(frozen=True)
class _EvenColumns(EpilogueColumnSum):
    def finisher_column(self, t: Any, i: Any = 0) -> Any:  # thread t finishes column 2·t (round by round)
        return 2 * t + i * 2 * self.finishers


def finisher_every_other(lw: Lowering) -> Lowering:
    """The finishing thread t sums column 2t: the odd columns are never stored."""
    assert isinstance(lw, ContractionLowering) and lw.column_sum is not None
    return replace(lw, column_sum=_EvenColumns(**vars(lw.column_sum)))


@dataclass(frozen=True)
class _PairOnOneRegister(EpilogueColumnSum):
    def register(self, j: Any, q: Any) -> Any:  # a pair's two columns kept in one running sum
        return 2 * j + 0 * q


def pair_on_one_register(lw: Lowering) -> Lowering:
    """Each thread keeps both columns of a pair in one running sum (`colsum[2j]`): the two columns' sums mix."""
    assert isinstance(lw, ContractionLowering) and lw.column_sum is not None
    return replace(lw, column_sum=_PairOnOneRegister(**vars(lw.column_sum)))


@dataclass(frozen=True)
class _OneShort(EpilogueColumnSum):
    def arrivals(self, sizes: Any) -> Any:  # the count one short: a block before the last finishes
        return super().arrivals(sizes) - 1


@dataclass(frozen=True)
class _CounterKept(EpilogueColumnSum):
    def counter_after(self) -> int:  # the finishing block leaves its count: the next launch starts from it
        return 1


@dataclass(frozen=True)
class _RowsOverlap(EpilogueColumnSum):
    def partial_offset(self, tm: Any, n: Any, sizes: Any) -> Any:  # tile rows #N − 1 apart: they overlap
        return tm * (sizes[self.n] - 1) + n


@dataclass(frozen=True)
class _OneCounter(EpilogueColumnSum):
    def counter_slot(self, tn: Any) -> Any:  # every column tile on counter 0
        return 0 * tn


def _as(cls: type) -> Any:
    def planted(lw: Lowering) -> Lowering:
        assert isinstance(lw, ContractionLowering) and lw.column_sum is not None and lw.column_sum.combine
        return replace(lw, column_sum=cls(**vars(lw.column_sum)))
    return planted


COMBINED = {"M": 300}  # five tiles of 64 rows: the tile rows' sums meet in the launch's workspace

MUTANT_ENTRIES = (
    ("column-sum-shuffle-short", "a column sum in the epilogue whose lanes 16 apart never combine", EXAMPLE, MODEL,
     {}, shuffle_short),
    ("column-sum-shuffle-across-pairs", "a column sum's shuffle adding lanes of other columns (xor 2)", EXAMPLE,
     MODEL, {}, shuffle_across_pairs),
    ("column-sum-padding-rows", "a column sum adding the tile's rows past #M", EXAMPLE, MODEL, {},
     padding_rows_added),
    ("column-sum-pair-on-one-register", "a column sum keeping a pair's two columns in one running sum", EXAMPLE,
     MODEL, {}, pair_on_one_register),
    ("column-sum-writers-too-many", "a column sum whose lanes 4..7 store their warp's sums too", EXAMPLE, MODEL, {},
     writers_too_many),
    ("column-sum-warp-slots-overlap", "a column sum's warps writing overlapping shared slots", EXAMPLE, MODEL, {},
     warp_slots_overlap),
    ("column-sum-odd-columns-unstored", "a column sum whose finishing threads skip the odd columns", EXAMPLE, MODEL,
     {}, finisher_every_other),
    ("column-sum-ffn-bias-gradient", "the FFN backward's dB1, summed beside dT2, shuffling across column pairs",
     FFN, "FFN-SKIP:backward", FFN_SHAPE, shuffle_across_pairs, FFN_PINS, 1),
    ("column-sum-load-summed-as-end", "the FFN backward's dB2 beside dX summing dX, not the dT6 it reads", FFN,
     "FFN-SKIP:backward", FFN_SHAPE, load_summed_as_end, FFN_PINS, 2),
    ("column-sum-combine-one-short", "a column sum over tile rows finished by the next-to-last block to count",
     EXAMPLE, MODEL, COMBINED, _as(_OneShort)),
    ("column-sum-combine-counter-kept", "a column sum whose finishing block leaves its counter at 1", EXAMPLE,
     MODEL, COMBINED, _as(_CounterKept)),
    ("column-sum-combine-rows-overlap", "a column sum's tile rows kept #N − 1 sums apart (overlapping)", EXAMPLE,
     MODEL, COMBINED, _as(_RowsOverlap)),
    ("column-sum-combine-one-counter", "a column sum counting every column tile on one counter", EXAMPLE, MODEL,
     COMBINED, _as(_OneCounter)),
)

__all__ = ["MUTANT_ENTRIES", "pair_on_one_register", "shuffle_across_pairs", "writers_too_many"]
