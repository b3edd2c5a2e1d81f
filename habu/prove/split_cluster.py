"""The finite-field check's run of a cluster split's reduction (habu/lower/split_cluster.py).

Each split's exact partial tile is written into its block's simulated shared memory at the lowering's
`partial_word` (words nothing writes hold poison); then every rank's consumer threads read their pairs
(`reduced_pair`) back at the same words of every block of the cluster and add them in rank order. The
sums the epilogue sees are exactly what those maps deliver: a map that drops, repeats or misplaces an
element shows as a wrong output element, and a map that reduces some element twice or never is a fault.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from habu.lower.contraction import ContractionLowering
from habu.lower.split_cluster import ClusterSplitReduction


def reduction_faults(red: ClusterSplitReduction) -> list[str]:
    """Every element of the tile is added up by exactly one (rank, thread, iteration), and every partial
    word lies in the partial tile, one word per element."""
    counts = np.zeros((red.bm, red.bn), dtype=np.int64)
    faults = []
    for rank in range(red.split):
        row, col, _q = _pairs(red, rank)
        row1, col1 = (np.asarray(x) for x in red.second(row, col))
        ok = ((row >= 0) & (row < red.bm) & (col >= 0) & (col < red.bn)
              & (row1 >= 0) & (row1 < red.bm) & (col1 >= 0) & (col1 < red.bn))
        if not np.all(ok):
            faults.append(f"the cluster split's rank {rank} adds up a pair outside the {red.bm}x{red.bn} tile")
            row, col, row1, col1 = row[ok], col[ok], row1[ok], col1[ok]
        np.add.at(counts, (row, col), 1)
        np.add.at(counts, (row1, col1), 1)
    if np.any(counts != 1):
        r, c = (int(x[0]) for x in np.nonzero(counts != 1))
        faults.append(f"the cluster split adds up element {r * red.bn + c} of its {red.bm}x{red.bn} tile "
                      f"(row {r}, column {c}) {int(counts[r, c])} times, not once")
    rows, cols = np.meshgrid(np.arange(red.bm), np.arange(red.bn), indexing="ij")
    words = np.asarray(red.partial_word(rows, cols)).reshape(-1)
    if words.min() < 0 or 4 * (words.max() + 1) > red.bytes or len(np.unique(words)) != words.size:
        faults.append("the cluster split's partial words are not distinct words of the partial tile")
    return faults


def _pairs(red: ClusterSplitReduction, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, col) of the first element of every pair rank `rank` adds up (q < pairs)."""
    t = np.arange(red.threads, dtype=np.int64)[:, None]
    i = np.arange(red.iterations, dtype=np.int64)[None, :]
    row, col, q = red.reduced_pair(np.int64(rank), t, i)
    row, col, q = (np.broadcast_to(np.asarray(x), (red.threads, red.iterations)).reshape(-1) for x in (row, col, q))
    keep = q < red.pairs
    return row[keep], col[keep], q[keep]


def cluster_sums(red: ClusterSplitReduction, partials: Mapping[int, np.ndarray], lrows: tuple[int, ...],
                 lcols: tuple[int, ...], p: int, poison) -> np.ndarray:
    """The sums (tiles, rows, cols) the ranks' threads compute for the lanes `lrows` x `lcols` of each tile,
    from each split's partial (tiles, rows, cols) over GF(p); a lane no thread adds up stays poison."""
    tiles = next(iter(partials.values())).shape[0]
    words = red.bytes // 4
    lr, lc = np.array(lrows, dtype=np.int64), np.array(lcols, dtype=np.int64)
    smem = np.broadcast_to(poison(np.arange(words, dtype=np.int64) * 31 + 7), (red.split, tiles, words)).copy()
    if red.fragment_pairs:  # the fragment's pairs of adjacent columns, one float2 at the first element's word
        first = lc - lc % 2
        at = np.asarray(red.partial_word(lr[:, None], first[None, :])) + (lc % 2)[None, :]
    else:  # each element of the fragment at its own word
        at = np.broadcast_to(np.asarray(red.partial_word(lr[:, None], lc[None, :])), (len(lr), len(lc)))
    inside = (at >= 0) & (at < words)
    for s, acc in partials.items():  # a block's partial stores (words outside the tile: not stored)
        for x in range(tiles):
            smem[s, x, at[inside]] = acc[x][inside]
    sums = np.broadcast_to(poison(lr[:, None] * 7919 + lc[None, :] + 3), (tiles, len(lr), len(lc))).copy()
    row_of = {int(r): i for i, r in enumerate(lr.tolist())}
    col_of = {int(c): j for j, c in enumerate(lc.tolist())}
    for rank in range(red.split):
        row, col, _q = _pairs(red, rank)
        for half, (er, ec) in enumerate(((row, col), red.second(row, col))):  # the pair read as one float2
            er, ec = np.broadcast_to(np.asarray(er), row.shape), np.broadcast_to(np.asarray(ec), row.shape)
            word = np.asarray(red.partial_word(row, col)) + half
            ok = (word >= 0) & (word < words)
            for r, c, w in zip(er[ok].tolist(), ec[ok].tolist(), word[ok].tolist(), strict=True):
                if r in row_of and c in col_of:
                    sums[:, row_of[r], col_of[c]] = smem[:, :, w].sum(axis=0) % p
    return sums


def finish_cluster_split(name: str, lw: ContractionLowering, sizes: Mapping[str, int], mem: Any,
                         partials: Mapping[tuple, Mapping[tuple[int, int], Mapping[int, tuple]]],
                         epilogue: Callable[..., None]) -> None:
    """The end of a cluster split's blocks: `partials[(batch, rows, cols)][(tm, tn)][split]` holds each
    split's exact partial and its output rows and columns; the maps' faults go to `mem`, and
    `epilogue(sums, rows, cols, batch coordinates, where)` runs on what the ranks add up."""
    red = lw.reduction
    assert red is not None
    for fault in reduction_faults(red):
        mem.fault(f"{name}: {fault}")
    for (z, lrows, lcols), by_tile in sorted(partials.items()):
        tiles = sorted(by_tile)
        missing = np.zeros((len(lrows), len(lcols)), np.int64)  # a split no block ran: poison
        parts = {s: np.stack([by_tile[t][s][0] if s in by_tile[t] else mem.poison(missing + s) for t in tiles])
                 for s in range(lw.kernel.split_k)}
        sums = cluster_sums(red, parts, lrows, lcols, mem.field.p, mem.poison)
        some = [next(iter(by_tile[t].values())) for t in tiles]
        mc, nc = np.stack([x[1] for x in some]), np.stack([x[2] for x in some])
        batch = {axis: np.int64(v) for axis, v in lw.batch_coordinates(np.int64(z), sizes).items()}

        def where(bad: np.ndarray, mc=mc, nc=nc) -> str:
            b = int(np.nonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0][0]) if bad.ndim else 0
            return f"the cluster split's sums of the tile at {lw.out.tensor} row {int(mc[b, 0])}, column {int(nc[b, 0])}"
        epilogue(sums, mc, nc, batch, where)


__all__ = ["cluster_sums", "finish_cluster_split", "reduction_faults"]
