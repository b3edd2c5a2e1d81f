"""Planted bugs in a transposed product (`ContractionKernel.swap_ab`: the tile's rows along the output's columns,
A the factor that carries them). The orientation lives in the lowering's accesses (habu.lower.contraction
`lower_contraction`, from `Contraction.swapped`), which the emitter prints and the finite-field check runs, so a
swapped plan whose accesses keep one piece of the product as written must be killed (habu.bench.mutants lists
them)."""

from __future__ import annotations

from dataclasses import replace

from habu.bench.mutants_ktile import ahead_from_first_stage
from habu.bench.mutants_split import planted_reduction
from habu.lower import ContractionLowering, Lowering
from habu.lower.access import Access, Position

# GGEMM with its gathered tokens along the tile's columns (cp.async, kernel B) and a ragged last tile each way
GG_SHAPE = {"M": 13, "N": 300, "K": 1000}
GG_PINS = {"swap_ab": "true", "tile": "64x16x64", "stages": "4"}
# FFN-SKIP's first product transposed: its bias runs along the tile's rows
FF_SHAPE = {"B": 13, "D": 256, "H": 320}
FF_PINS = {"swap_ab": "true", "tile": "64x16x64", "stages": "4"}
# the weights' (A's) boxes ahead of each output tile's gathered tokens
A_AHEAD_PINS = {**GG_PINS, "a_ahead": "true"}
# a cluster split of the transposed product: its reduced pairs run along the tile's m (the output's columns)
SPLIT_PINS = {**GG_PINS, "split_k": "2", "split_reduce": "cluster"}


def _swapped(lw: Lowering) -> ContractionLowering:
    assert isinstance(lw, ContractionLowering) and lw.kernel.swap_ab
    return lw


def _axes_exchanged(acc: Access) -> Access:
    """`acc` read with its m and n positions exchanged (its masks kept)."""
    swap = {"m": "n", "n": "m"}
    return replace(acc, positions=tuple(Position("axis", swap[p.axis]) if p.kind == "axis" and p.axis in swap else p
                                        for p in acc.positions))


def store_as_written(lw: Lowering) -> Lowering:
    """The tile is stored as if it were not transposed: element (weight column, token) at [token rows, ...] is
    written at row = weight column, column = token."""
    lw = _swapped(lw)
    return replace(lw, out=_axes_exchanged(lw.out))


def bias_along_tokens(lw: Lowering) -> Lowering:
    """The epilogue's bias (`B1[0 n]`, one value per weight column) read at the token index."""
    lw = _swapped(lw)
    return replace(lw, epi_loads=tuple((ld, _axes_exchanged(acc)) if ld.tensor.startswith("B") else (ld, acc)
                                       for ld, acc in lw.epi_loads))


def split_pairs_along_n(lw: Lowering) -> Lowering:
    """A transposed cluster split's reduced pair taken as two adjacent columns (row, col + 1), as in a product
    as written, while its column-major partials hold (row + 1, col) at the word after the first."""
    lw = _swapped(lw)
    assert lw.reduction is not None and lw.reduction.pair_axis == "m"
    return planted_reduction(lw, second=lambda self, row, col: (row, col + 1))


def split_partial_columns_overlap(lw: Lowering) -> Lowering:
    """A transposed cluster split's column-major partials two words short a column: each column's last two rows
    land on the next column's first two."""
    lw = _swapped(lw)
    assert lw.reduction is not None and lw.reduction.pair_axis == "m"
    return planted_reduction(lw, partial_word=lambda self, row, col: col * (self.bm - 2) + row)


MUTANT_ENTRIES = (
    ("swap-store-as-written", "a transposed (swap_ab) product stores its tile as if it were not transposed: weight "
     "columns as token rows", "ggemm.habu", "GGEMM", GG_SHAPE, store_as_written, GG_PINS),
    ("swap-bias-along-tokens", "a transposed product's epilogue reads the bias at the token index instead of the "
     "weight column", "ffn_skip.habu", "FFN-SKIP", FF_SHAPE, bias_along_tokens, FF_PINS),
    ("a-ahead-from-first-stage", "the wgmma producer issues a transposed product's A boxes (its weights) ahead of "
     "each output tile from stage 0 with phase 0, not from the ring's state", "ggemm.habu", "GGEMM", GG_SHAPE,
     ahead_from_first_stage, A_AHEAD_PINS),
    ("swap-split-pairs-along-n", "a transposed product's cluster split reads its reduced pairs as two adjacent "
     "columns while its partials hold two adjacent rows", "ggemm.habu", "GGEMM", GG_SHAPE, split_pairs_along_n,
     SPLIT_PINS),
    ("swap-split-partial-columns-overlap", "a transposed product's cluster split stores its column-major partials two "
     "words short a column", "ggemm.habu", "GGEMM", GG_SHAPE, split_partial_columns_overlap, SPLIT_PINS),
)

__all__ = ["A_AHEAD_PINS", "FF_PINS", "FF_SHAPE", "GG_PINS", "GG_SHAPE", "MUTANT_ENTRIES", "SPLIT_PINS", "bias_along_tokens",
           "split_pairs_along_n", "split_partial_columns_overlap", "store_as_written"]
