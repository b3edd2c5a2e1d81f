"""Planted bugs in a cluster split's reduction maps (habu/lower/split_cluster.py): the finite-field check
runs the maps the emitter prints, so each must be killed (habu.bench.mutants lists them)."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from habu.lower import ContractionLowering, Lowering
from habu.lower.access import floordiv
from habu.lower.split_cluster import ClusterSplitReduction

SHAPE = {"M": 100, "N": 300, "K": 1000}
PINS = {"tile": "64x128x64", "stages": "4", "split_k": "4", "split_reduce": "cluster"}


def planted_reduction(lw: Lowering, **methods: Any) -> Lowering:
    """`lw` with its cluster split's reduction maps replaced by `methods` (the planted bug)."""
    assert isinstance(lw, ContractionLowering) and lw.reduction is not None
    red = lw.reduction
    cls = type("PlantedReduction", (ClusterSplitReduction,), methods)
    return replace(lw, reduction=cls(**{f.name: getattr(red, f.name) for f in fields(red)}))


def ranks_overlap(lw: Lowering) -> Lowering:
    """Rank r starts at row r·(BM/S − 1): neighbouring ranks both finish one row, the last rows nobody."""
    def reduced_pair(self, rank, thread, iteration):
        q = thread + self.threads * iteration
        half = self.bn // 2
        row_in = floordiv(q, half)
        return rank * (self.rows_per_rank - 1) + row_in, (q - row_in * half) * 2, q
    return planted_reduction(lw, reduced_pair=reduced_pair)


def partial_rows_overlap(lw: Lowering) -> Lowering:
    """The partial tile's rows are BN − 2 words apart: each row's last pair lands on the next row's first."""
    return planted_reduction(lw, partial_word=lambda self, row, col: row * (self.bn - 2) + col)


def partial_column_major(lw: Lowering) -> Lowering:
    """The partial tile stored column-major, while the fragment's pairs (and the readers) take two
    adjacent words as two adjacent columns: (row, col + 1) lands on (row + 1, col)."""
    return planted_reduction(lw, partial_word=lambda self, row, col: col * self.bm + row)


__all__ = ["PINS", "SHAPE", "partial_column_major", "partial_rows_overlap", "planted_reduction", "ranks_overlap"]
