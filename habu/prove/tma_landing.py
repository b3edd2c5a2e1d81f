"""Where the TMA boxes of a wgmma ring land, against where the stage tiles keep their elements.

The operand route (`habu.prove.smem_route.wgmma_route`) fills each stage tile through the tile's own
layout (`SmemTile.storage`, `byte_offset`); the kernel issues TMA boxes (`habu.lower.pipeline.
TmaOperandLoad`), box j of a k tile at byte `landing(j)` of the stage's tile, its elements where TMA's
swizzle puts them (`habu.prove.fragments.tma_box_bytes`, the trusted table). This check runs the two
against each other for every box of every TMA operand: the box's element (row r, inner column c) is
the operand's (m/n, k) at the box's row box and k box (`row_box`, `k_box`: the same functions the
emitter prints the boxes' coordinates from), and it must land where the tile keeps that element.
A box landing on another's bytes, a k box numbered in the wrong order or a block of the tile in the
wrong place is a fault of the finite-field check.
"""

from __future__ import annotations

import numpy as np

from habu.lower.layouts import SmemTile, WgmmaOperands
from habu.lower.pipeline import MbarrierRing, TmaOperandLoad
from habu.prove.fragments import tma_box_bytes


def _box_faults(load: TmaOperandLoad, tile: SmemTile) -> list[str]:
    # the box's rows and inner columns: K-major boxes are box_rows rows (of m/n) by box_k columns of k;
    # MN-major ones box_k rows of k by box_rows columns of m/n
    rows, cols = (load.box_k, load.box_rows) if load.mn_major else (load.box_rows, load.box_k)
    span = tile.swizzle
    if span and cols * load.element_bytes > span:
        return [f"{load.side}'s TMA box is {cols * load.element_bytes} bytes wide, past its {span}-byte swizzle"]
    offsets = tma_box_bytes(rows, cols, load.element_bytes, span)
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(cols, dtype=np.int64)[None, :]
    faults = []
    for j in range(load.boxes):
        mn0, k0 = int(load.row_box(j)) * load.box_rows, int(load.k_box(j)) * load.box_k
        mn, k = (mn0 + c, k0 + r) if load.mn_major else (mn0 + r, k0 + c)
        mn, k = np.broadcast_to(mn, offsets.shape), np.broadcast_to(k, offsets.shape)
        kept = np.asarray(tile.byte_offset(*tile.storage(mn, k)), dtype=np.int64)
        landed = int(load.landing(j)) + offsets
        wrong = kept != landed
        if wrong.any():
            i = tuple(int(x[0]) for x in np.nonzero(wrong))
            faults.append(f"{load.side}'s TMA box {j} writes the k tile's {load.side}[{int(mn[i])}, {int(k[i])}] (tile row, "
                          f"k column) at byte {int(landed[i])} of the stage tile, which keeps it at byte {int(kept[i])}")
    return faults


def tma_landing_faults(ring: object, ops: object) -> list[str]:
    """Each TMA box of a wgmma ring's k tile lands where the stage tile keeps its elements."""
    if not isinstance(ring, MbarrierRing) or not isinstance(ops, WgmmaOperands):
        return []
    faults: list[str] = []
    for load in ring.loads:
        if load.cluster > 1:  # a multicast box lands at the issuer's slot (one span of k: checked by the route)
            continue
        faults += _box_faults(load, ops.a_tile if load.side == "A" else ops.b_tile)
    return faults[:4]


__all__ = ["tma_landing_faults"]
