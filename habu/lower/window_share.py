"""What a contraction's k window (habu/lower/k_bounds.py) saves, for the cost model and the paths' defaults: the
share of the k steps its tiles still run, and how long the grid then takes against the same grid without it.

Each tile runs its own window; the GPU runs them `sm_count` at a time, the next tile where one finishes. The grid
takes at least its total steps spread over the SMs and at least its longest tile: a causal dQ of 128 tiles (one
wave of 132 SMs) gains nothing while its last tile row still runs every k tile, where the same work in 256
half-tiles finishes in about half the time."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from habu.lower.contraction import ContractionLowering


def window_share(lw: ContractionLowering, sizes: Mapping[str, int], sm_count: int) -> tuple[float, float]:
    """(the share of the k steps the windowed tiles run, the grid's time against the unwindowed grid's): (1, 1)
    without a window."""
    if not lw.window:
        return 1.0, 1.0
    tm = np.arange(int(lw.tiles_m(sizes)), dtype=np.int64)[:, None]
    tn = np.arange(int(lw.tiles_n(sizes)), dtype=np.int64)[None, :]
    steps, full = [], []
    for split in range(lw.kernel.split_k):
        begin, end = lw.tile_k_range(split, sizes, tm, tn)
        b0, e0 = (int(x) for x in lw.k_range(split, sizes))
        steps.append(np.broadcast_to(np.maximum(0, np.asarray(end) - np.asarray(begin)), (tm.size, tn.size)))
        full.append(max(0, e0 - b0))
    batches = int(lw.batches(sizes))
    ran = np.stack(steps)
    tiles = ran.size * batches
    most = max(full)
    if not tiles or not most:
        return 1.0, 1.0
    total = float(ran.sum()) * batches
    unwindowed = -(-tiles // max(1, sm_count)) * most
    return total / (tiles * most), window_steps(lw, sizes, sm_count) / unwindowed


def window_steps(lw: ContractionLowering, sizes: Mapping[str, int], sm_count: int) -> float:
    """The k steps the busiest SM runs, at least: the grid's windowed steps spread over the SMs, and its longest
    tile's (every k tile of the split where there is no window, waves rounded up)."""
    tm = np.arange(int(lw.tiles_m(sizes)), dtype=np.int64)[:, None]
    tn = np.arange(int(lw.tiles_n(sizes)), dtype=np.int64)[None, :]
    ran = np.stack([np.broadcast_to(np.maximum(0, np.asarray(end) - np.asarray(begin)), (tm.size, tn.size))
                    for begin, end in (lw.tile_k_range(split, sizes, tm, tn) for split in range(lw.kernel.split_k))])
    if not ran.size:
        return 0.0
    total = float(ran.sum()) * int(lw.batches(sizes))
    if not lw.window:
        return -(-ran.size * int(lw.batches(sizes)) // max(1, sm_count)) * float(ran.max())
    return max(total / max(1, sm_count), float(ran.max()))


__all__ = ["window_share", "window_steps"]
