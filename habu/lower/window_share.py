"""What a contraction's k window (habu/lower/k_bounds.py) saves, for the cost model: the share of the k steps its
tiles still run.

The cost model scales the product's operand traffic and its multiply time by the share. Measured on attention's
backward at 16 × 1k (H100, 2026-12-07, docs/PERF.md "Session 66"): dQ's 128 tiles (one wave) went 19.1 → 11.1 µs
with 56% of their k steps (0.58), though its last tile row still runs every k tile: its tiles share the DRAM
and the L2, and the short ones leave them to the long ones. Half-height tiles (256 of them, so that the longest
tile is half as long) were no faster (13.1 µs)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from habu.lower.contraction import ContractionLowering


def window_share(lw: ContractionLowering, sizes: Mapping[str, int]) -> float:
    """The share of the k steps the windowed tiles run (1 without a window)."""
    if not lw.window:
        return 1.0
    tm = np.arange(int(lw.tiles_m(sizes)), dtype=np.int64)[:, None]
    tn = np.arange(int(lw.tiles_n(sizes)), dtype=np.int64)[None, :]
    ran, full = 0.0, 0.0
    for split in range(lw.kernel.split_k):
        begin, end = lw.tile_k_range(split, sizes, tm, tn)
        b0, e0 = (int(x) for x in lw.k_range(split, sizes))
        ran += float(np.broadcast_to(np.maximum(0, np.asarray(end) - np.asarray(begin)), (tm.size, tn.size)).sum())
        full += max(0, e0 - b0) * tm.size * tn.size
    return ran / full if full else 1.0


__all__ = ["window_share"]
