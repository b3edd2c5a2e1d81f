"""The finite-field check of a contraction's k window (habu/lower/k_bounds.py): the k tiles a tile skips change
none of the values it stores.

The interpreter runs each tile over its window, as the kernel does. Here it also sums, exactly, the terms of the
k tiles the window leaves out of the split's range (`skipped_terms`: the operands read through the model's own
accesses); the epilogue is evaluated on the accumulator with and without them, and every stored value must be the
same. An operand bound's terms are zero (the sum adds nothing); a tile whose outputs are zero whatever the product
(P's own mask) stores the same value from either accumulator. A window wrong at any element of the tiles run is a
fault naming the element. Windowed kernels run every row and column of every tile (habu/prove/interp.py), so each
tile's edge against the diagonal is run; the `k-window` rule proves the windows for all tiles with z3."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from habu.lower.contraction import ContractionLowering

CHUNK = 64  # k values read and multiplied at once


def skipped_ranges(lw: ContractionLowering, split: int, begin: int, end: int, sizes: Mapping[str, int]
                   ) -> list[tuple[int, int]]:
    """The k tiles of the split's range its window leaves out: [b0, begin) and [end, e0) (the empty ones dropped)."""
    b0, e0 = (int(x) for x in lw.k_range(split, sizes))
    end = max(end, begin)
    return [(a, b) for a, b in ((b0, min(begin, e0)), (max(end, b0), e0)) if b > a]


def skipped_terms(name: str, lw: ContractionLowering, ranges: list[tuple[int, int]], mc: np.ndarray, nc: np.ndarray,
                  batch: Mapping[str, Any], sizes: Mapping[str, int], mem: Any, read: Any) -> np.ndarray:
    """Σ A[m k]·B[n k] over the k of the skipped tiles `ranges`, for the blocks' rows `mc` (blocks, R) and columns
    `nc` (blocks, C), over the field: each operand read by its access (masks, gathers) at the element's k."""
    f = mem.field
    total = np.zeros((mc.shape[0], mc.shape[1], nc.shape[1]), dtype=np.int64)
    ks = np.concatenate([np.arange(a * lw.bk, min(b * lw.bk, sizes[lw.k]), dtype=np.int64) for a, b in ranges]
                        or [np.zeros(0, np.int64)])
    for first in range(0, len(ks), CHUNK):
        k = ks[first:first + CHUNK][None, None, :]
        a = read(f"{name} (a skipped k tile)", lw.a, {**batch, "m": mc[:, :, None], "k": k}, sizes, mem, lw.index_width)
        b = read(f"{name} (a skipped k tile)", lw.b, {**batch, "n": nc[:, :, None], "k": k}, sizes, mem, lw.index_width)
        a, b = np.broadcast_to(a, (*mc.shape, k.shape[-1])), np.broadcast_to(b, (*nc.shape, k.shape[-1]))
        total = (total + f.contract([a, b], "xmk,xnk->xmn")) % f.p
    return total


def window_mismatch(values: list[np.ndarray], full: list[np.ndarray], owned: np.ndarray) -> tuple[int, np.ndarray] | None:
    """The first stored value (its index in `values`) that differs where the skipped terms are added back, and where
    (a boolean array over the blocks' elements); None where none does."""
    for i, (v, w) in enumerate(zip(values, full, strict=True)):
        bad = owned & (np.broadcast_to(v, owned.shape) != np.broadcast_to(w, owned.shape))
        if np.any(bad):
            return i, bad
    return None


def check_window(name: str, lw: ContractionLowering, computed: list[np.ndarray], full: list[np.ndarray],
                  owned: np.ndarray, at: tuple[np.ndarray, np.ndarray, Mapping[str, Any]], mem: Any) -> None:
    """Faults where a stored value (each of `lw.stores`) computed on the window's accumulator, `computed`, differs
    from `full`, the epilogue with the skipped terms added back, naming the element (`at`: the blocks' rows,
    columns and batch coordinates)."""
    if (bad := window_mismatch(computed, full, owned)) is not None:
        mc, nc, batch = at
        x, r, col = (int(v[0]) for v in np.nonzero(bad[1]))
        axes = {**{a: int(v) for a, v in batch.items()}, "m": int(mc[x, r]), "n": int(nc[x, col])}
        mem.fault(f"{name}: the k tiles its window skips change {element_name(lw.stores[bad[0]][1], axes)} (their "
                  "terms are not zero there)")


def element_name(access: Any, by_axis: Mapping[str, int]) -> str:
    """`T[i, j, ...]`: the element of the stored access at the kernel axes' coordinates."""
    return f"{access.tensor}[{', '.join(str(by_axis.get(p.axis, p.value)) for p in access.positions)}]"


__all__ = ["check_window", "element_name", "skipped_ranges", "skipped_terms", "window_mismatch"]
