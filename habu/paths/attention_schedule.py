"""How long the fused attention kernel's wgmma main loop takes, from how its work tiles land on the SMs: each work
tile (a query tile of one batch element) costs a fixed part (its Q load, the ring's fill, the chain of S,
softmax and P·V restarting, the epilogue) plus one step a KV tile it visits (the causal skip leaves the first
query tiles few). One tile a block: the hardware hands the blocks, heaviest first, to the SM that frees first
(list scheduling, `lpt_makespan`). Persistent: block b of one an SM walks the tiles `work_of(b, n, G)` (a snake
over the same order, `snake_makespan`), and hides part of each tile's fixed cost under the last one's.

Fit on the H200 (session 33, docs/PERF.md; head width 128, 128 × 128 tiles, 3 stages, ping-pong): 4 × 16 × 1024
causal / full, 16 × 4096 causal / full, one tile a block and persistent in a round robin: a KV step at
`KV_STEP_SHARE` of the tensor-core probe's 810 TFLOP/s (1.49 µs), a tile's fixed part `TILE_FIXED_S` (9.5 µs). The
model gave 64.8 / 63.2, 85.7 / 81.1, 134.9 / 152.6 and 228.7 µs where those runs took 71.2 / 62.0, 88.8 / 84.2,
138.8 / 146.9 and 226.2 µs (one tile a block / round robin). Refit in session 36 after the vector epilogue cut a
tile's end: the persistent tile's fixed part `TILE_FIXED_PERSISTENT_S` 8.35 → 1.5 µs and a KV step no shorter than
the softmax of its scores (`SOFTMAX_SCORES_PER_S`: head width 64's steps are the softmax's); with `kv_dram_bytes`
under the memory bound, the defaults of 18 prefills (16k tokens a batch, d64 and d128, causal and full, GQA) come
within −14% .. +11% of that session's runs (tests/search/test_attention_schedule.py)."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from habu.lower.attention_wgmma import AttentionWgmmaLowering
from habu.prove.interp_attention_wgmma import walk
from habu.spec.ir import IndexConst, IndexVar
from habu.target import Target

KV_STEP_SHARE = 0.92  # the share of the wgmma probe's rate (`Ceilings.wgmma_flops`) a KV step runs at
# the online softmax's rate, scores a second an SM (scale, mask, max, exp, sum, pack: a 128 × 128 tile of S in 1.18
# µs on the H200, session 36's 1 × 16 × 16384 d64 full run, where the products would take 0.74): a KV step takes the
# longer of the two
SOFTMAX_SCORES_PER_S = 128 * 128 / 1.18e-6
# ... with three consumer warpgroups (192 query rows: twelve warps share the SM's softmax work, not eight): a 192 ×
# 128 tile of S in 1.40 µs (session 41, 4 × 16 × 4096 and 1 × 16 × 16384 d64 full, persistent, 4 stages: the model
# gives 513 and 1992 µs where the runs took 528.0-529.4 and 1995.1-2019.8)
THREE_CONSUMER_SCORES_PER_S = 192 * 128 / 1.40e-6
TILE_FIXED_S = 9.5e-6  # a work tile's fixed cost, one tile a block (session 33, before the vector epilogue)
# ... in a persistent block, its Q and ring fill under the last tile's work: 8.35 µs in session 33; 1.5 µs since the
# vector epilogue (session 36: 1.6-2.3 µs at d128 on 1k-4k sequences, 0.8 at d64, by the runs in docs/PERF.md)
TILE_FIXED_PERSISTENT_S = 1.5e-6
# ... with three consumer warpgroups (no ping-pong partner hides a tile's first Q·Kᵀ product and last P·V, and Q is
# 192 rows): 4.0 µs, fit with `THREE_CONSUMER_SCORES_PER_S` on session 41-42's d64 full runs (16 × 1k 181.9-183.9 µs,
# 4 × 4k 526.1-535.0, 1 × 16k 1995.1-2019.8; the model 182, 537, 2015). With 1.5 µs it priced the 1k sequences'
# six 192-row tiles 13% below the two-consumer default, which ran 164.2 µs in the same run
TILE_FIXED_THREE_CONSUMERS_S = 4.0e-6
LIST_SCHEDULE_TILES = 20_000  # past this many work tiles, the bound (mean load plus one tile) instead


class _Unknown(Exception):
    """A mask term the host cannot evaluate (a gathered offset): every key is assumed visible."""


def _term(ix: Any, row: Any) -> Any:
    if isinstance(ix, IndexVar) and ix.name == "i":
        return row
    if isinstance(ix, IndexConst):
        return ix.value
    raise _Unknown


def kv_tiles_of(lw: AttentionWgmmaLowering, qt: int, sizes: Mapping[str, int]) -> int:
    """The KV tiles query tile qt visits (all where the mask reads an index tensor)."""
    keys = int(sizes[lw.key_extent])
    try:
        limit = int(lw.key_limit(qt, sizes, _term))
    except _Unknown:
        limit = keys
    return int(lw.kv_tiles(limit, sizes, lambda x, lo, hi: min(max(x, lo), hi)))


def work_kv_tiles(lw: AttentionWgmmaLowering, sizes: Mapping[str, int]) -> list[int]:
    """Each work tile's KV tiles, in the launch's order (heaviest first)."""
    qt = np.asarray(lw.query_tile(np.arange(int(lw.work_tiles(sizes)), dtype=np.int64), sizes), dtype=np.int64)
    per_tile = np.asarray([kv_tiles_of(lw, q, sizes) for q in range(int(lw.query_tiles(sizes)))], dtype=np.int64)
    return per_tile[qt].tolist()


def lpt_makespan(costs: Sequence[float], slots: int) -> float:
    """The last SM's finish when each tile in turn goes to the SM that frees first."""
    if len(costs) > LIST_SCHEDULE_TILES:
        return sum(costs) / slots + max(costs)
    free = [0.0] * max(1, min(slots, len(costs)))
    for cost in costs:
        heapq.heappush(free, heapq.heappop(free) + cost)
    return max(free)


def snake_makespan(lw: AttentionWgmmaLowering, costs: Sequence[float], slots: int) -> float:
    """The busiest persistent block's sum over the tiles its walk takes (`walk`: the kernel's, as the field
    check runs it)."""
    work = len(costs)
    grid = int(lw.persistent_blocks(work, slots))
    if work > LIST_SCHEDULE_TILES:
        return sum(costs) / grid + max(costs)
    return max(sum(costs[w] for w in walk(lw, b, grid, work)) for b in range(grid))


L2_SHARE = 0.5  # the share of the L2 a round's K and V may fill and still be there for the next round's tiles


def kv_dram_bytes(lw: AttentionWgmmaLowering, sizes: Mapping[str, int], target: Target) -> float:
    """The bytes of K and V the work tiles read from DRAM, by rounds of the launch order: the G tiles that run at
    once (a persistent grid's round n is work tiles n·G .. n·G + G − 1, `work_of`; one tile a block, a wave of one
    an SM) read each KV head they share once (their KV steps run side by side, so one tile's K tile is still in the
    L2 when the others ask for it), as far as the longest of their causal prefixes; a KV head the round before also
    read is free where that round's K and V fit in `L2_SHARE` of the L2. The grid's order decides it: a 4-sequence
    × 16-head batch of 1k keys in the heaviest-first order puts 132 different heads in every round and reads each
    head's K and V once a query tile (1.07 GB at 16 × 16 × 1024, d128; H200 session 36: 294.9 µs, as the copy
    bandwidth gives); `head_major` puts a head's query tiles in one round (140 MB, 213.8 µs)."""
    work = int(lw.work_tiles(sizes))
    if work == 0:
        return 0.0
    k_axes = {p.axis for p in lw.k.positions}
    n_e, n_d = int(sizes[lw.red_extent]), int(sizes[lw.col_extent])
    step_bytes = 2.0 * lw.kernel.bn * (n_e + n_d)
    grid = int(lw.persistent_blocks(work, target.sm_count)) if lw.persistent else target.sm_count
    w = np.arange(work, dtype=np.int64)
    tiles = np.asarray(work_kv_tiles(lw, sizes), dtype=np.int64)
    extent_of = dict(zip(lw.batch_axes, lw.batch_extents, strict=True))
    head = np.zeros(work, dtype=np.int64)  # the KV head: the batch coordinates K is read at, as one number
    for axis, value in lw.batch_coords(np.asarray(lw.batch_flat(w, sizes), dtype=np.int64), sizes).items():
        if axis in k_axes:
            head = head * int(sizes[extent_of[axis]]) + value
    heads = int(head.max()) + 1
    rounds = w // grid
    # each (round, head) once, with the longest prefix its tiles in that round read
    key = rounds * heads + head
    order = np.argsort(key, kind="stable")
    key_sorted = key[order]
    first = np.flatnonzero(np.r_[True, key_sorted[1:] != key_sorted[:-1]])
    need = np.maximum.reduceat(tiles[order], first)
    r_of = rounds[order][first]
    per_round = np.bincount(r_of, weights=need * step_bytes, minlength=int(rounds.max()) + 1)
    fits = per_round <= L2_SHARE * target.l2_bytes  # a round whose K and V the next round still finds in the L2
    unique = key_sorted[first]  # sorted: the (round, head) pairs
    before = unique - heads  # the same head, the round before
    at = np.minimum(np.searchsorted(unique, before), len(unique) - 1)
    found = (unique[at] == before) & (r_of > 0) & fits[np.maximum(r_of - 1, 0)]
    kept = np.where(found, need[at], 0)
    return float(np.sum(np.maximum(0, need - kept)) * step_bytes)


def wgmma_attention_seconds(lw: AttentionWgmmaLowering, sizes: Mapping[str, int], target: Target) -> float:
    """The main loop's time on `target` (without the launch and the memory bound)."""
    k = lw.kernel
    n_e, n_d = int(sizes[lw.red_extent]), int(sizes[lw.col_extent])
    step_flops = 2.0 * k.bm * k.bn * (n_e + n_d)
    softmax_rate = THREE_CONSUMER_SCORES_PER_S if lw.consumers == 3 else SOFTMAX_SCORES_PER_S
    step = max(step_flops / (target.ceilings.wgmma_flops * KV_STEP_SHARE / target.sm_count),
               k.bm * k.bn / softmax_rate)
    fixed = TILE_FIXED_PERSISTENT_S if lw.persistent else TILE_FIXED_S
    if lw.consumers == 3:
        fixed = max(fixed, TILE_FIXED_THREE_CONSUMERS_S)
    work = work_kv_tiles(lw, sizes)
    if k.kv_split:  # split-KV: a block a (split, work tile), each at most `split_tiles` of the tile's KV tiles
        per = lw.split_tiles
        splits = int(lw.splits(sizes))
        work = [max(0, min(per, n - s * per)) for n in work for s in range(splits)]
    costs = [fixed + n * step for n in work]
    if not costs:
        return 0.0
    return snake_makespan(lw, costs, target.sm_count) if lw.persistent else lpt_makespan(costs, target.sm_count)


__all__ = ["kv_dram_bytes", "kv_tiles_of", "lpt_makespan", "snake_makespan", "wgmma_attention_seconds", "work_kv_tiles"]
