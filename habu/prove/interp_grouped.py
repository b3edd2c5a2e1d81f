"""Executing a grouped-GEMM kernel over GF(p): the offsets, the tile scheduler and the selected blocks,
as the emitter prints them.

The offsets are the lowering's `lower_bound` over E's values as the check draws them (sorted, groups left
empty: `GroupedVirtualTensor`), run for every group 0..#G; the tile starts its `tile_starts`. Each block
(mt, nt) decodes its group and row tile (`decode`, `live`), reads A at its rows (`row`, masked by
`row_inside` at the group's end, then by the access's own masks and index checks) and W at its group's
slab, every k step (`k_index`), sums the products over GF(p), and stores its rows and columns. A row the
scheduler gives two blocks is written twice (a race the check names); a row it gives none is never
written (the check names it unwritten); a row read with another group's weights is a wrong value.

A row factor (`row_scale`, P[r]) is read at the block's rows and multiplies their sums after the constant
scale; a scatter-add store (ATOMIC_ADD) adds each value into the element the output access names (IX[r]
through its gather, index-checked), onto the target's prior contents, duplicates accumulating, as
atomicAdd does. An f32 A's bf16 parts are numerics, not algebra: the check runs the exact product. A
pair's second product (its own weights, the same A rows) and the node of both (SwiGLU: sigmoid is an
uninterpreted function over GF(p)) are computed from the two accumulators before the store.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from habu.lower.general import Store
from habu.lower.grouped import GroupedLowering, tile_starts
from habu.lower.grouped_wgmma import WgmmaMainLoop
from habu.lower.grouped_wgrad import GroupedWgradLowering
from habu.prove.fragments import fragment_mismatch
from habu.prove.grouped_route import (
    epilogue_moves,
    grouped_mma_route,
    producer_uncopied,
    vector_moves,
    wgmma_epilogue_moves,
    wgmma_loop_route,
)
from habu.prove.interp import Memory, eval_pointwise, read, write
from habu.prove.kinds import KindProof, TileAxis, register_kind
from habu.prove.pipeline import delivered
from habu.prove.smem_route import Route, wgmma_route
from habu.prove.tma_landing import tma_landing_faults
from habu.prove.virtual import WrittenTensor
from habu.spec.field import PrimeField
from habu.spec.ir import Expr


def _where(c, x, y):
    return np.where(c, x, y)


def group_offsets(lw: GroupedLowering, sizes: Mapping[str, int], mem: Memory) -> list[int]:
    """offs[g] for g in 0..#G: the lowering's binary search over E's values (read as the kernel reads
    them, E at rows below #R)."""
    rows, groups = sizes[lw.r], sizes[lw.g]
    table = mem.inputs[lw.groups]
    values = np.asarray(table.at(np.arange(rows, dtype=np.int64)), dtype=np.int64) if rows else np.zeros(0, np.int64)

    def value_at(mid: np.ndarray) -> np.ndarray:
        return values[np.clip(mid, 0, max(rows - 1, 0))] if rows else np.zeros_like(mid)

    g = np.arange(groups + 1, dtype=np.int64)
    offs = lw.lower_bound(value_at, g, rows, _where)
    return [int(x) for x in np.asarray(offs)]


def _scale(f: PrimeField, e: Expr, sizes: Mapping[str, int]) -> np.ndarray:
    """The product's constant factor (constants and sizes only) over GF(p)."""
    return eval_pointwise(e, lambda ld: None, f, sizes)


def _delivered_tiles(name: str, lw: GroupedLowering, steps: int, mem: Memory, computing: str) -> list[int | None]:
    """The k tile each of a block's `steps` k steps multiplies: the wgmma loop's ring as
    habu.prove.pipeline executes it (a fault is the check's, named by the tile `computing`), or the steps
    in order (mma.sync)."""
    if lw.wgmma is None:
        return list(range(steps))
    reads, fault = delivered(lw.wgmma.ring, steps)
    if fault is not None:
        mem.fault(f"while computing {computing}: {name}'s k pipeline: {fault}")
    return reads


def _mma_faults(name: str, lw: GroupedLowering, mem: Memory) -> None:
    """The mma.sync loop's shared-memory operands and epilogue map, routed through its maps
    (habu.prove.grouped_route: the threads' 16-byte copies, the warps' operand words, the accumulator's
    elements against the PTX ISA's tables): the kernel multiplies the tile product only where the route is
    the identity."""
    if lw.uses_wgmma:
        return
    if lw.mma is None:
        mem.fault(f"{name}: the mma.sync main loop has no stage maps for this tile")
        return
    route = grouped_mma_route(lw.mma)
    for fault in route.faults:
        mem.fault(f"{name}: {fault}")
    if not route.identity:
        mem.fault(f"{name}: the mma.sync operands' shared-memory route is not the tile's product (an element "
                  "multiplied at another row, column or k, or twice, or a tile element no warp computes)")
    if epilogue_moves(lw.mma) is not None:
        mem.fault(f"{name}: the epilogue stores an accumulator register at another tile element than the one "
                  "mma.sync put there")


def warpgroup_decode_faults(loop) -> list[str]:
    """A warp-specialised loop's thread decode over every thread (`warpgroup`, `consumer`; `threads`, 128 a
    warpgroup): warpgroup 0 the producer, 1..C the consumers 0..C-1."""
    tid = np.arange(loop.threads, dtype=np.int64)
    wg = np.asarray(loop.warpgroup(tid))
    cw = np.asarray(loop.consumer(wg))
    if np.array_equal(wg, tid // 128) and np.array_equal(cw[128:], tid[128:] // 128 - 1):
        return []
    bad = int(np.nonzero((wg != tid // 128) | (cw != tid // 128 - 1))[0][0])
    return [f"thread {bad} decodes as warpgroup {int(wg[bad])}, consumer {int(cw[bad])} (its warpgroup is "
            f"{bad // 128}: {'the producer' if bad < 128 else f'consumer {bad // 128 - 1}'})"]


def wgmma_thread_faults(loop: WgmmaMainLoop) -> list[str]:
    """The wgmma loop's thread maps, run over every thread: the warpgroup decode (warpgroup 0 the producer,
    1..C the consumers 0..C-1, 128 threads each), the producer's copies of A's k tile (each 16-byte chunk
    `a_copy_row`, `a_copy_k` once, the chunks the route fills by `StageCopy.along`), and the consumers'
    accumulator map against the PTX ISA's wgmma layout (`fragment_mismatch`)."""
    faults = warpgroup_decode_faults(loop)
    tid = np.arange(loop.threads, dtype=np.int64)
    copy = loop.operands.a_copy
    ptid = np.asarray(loop.producer_thread(tid[:128]))[:, None]
    j = np.arange(loop.producer_copies(), dtype=np.int64)[None, :]
    rows = np.broadcast_to(np.asarray(loop.a_copy_row(ptid, j)), (128, j.shape[1])).ravel()
    ks = np.broadcast_to(np.asarray(loop.a_copy_k(ptid)), (128, j.shape[1])).ravel()
    made = sorted(zip(rows.tolist(), ks.tolist(), strict=True))
    outer, inner = copy.along(np.arange(copy.count, dtype=np.int64))
    wanted = sorted(zip(np.asarray(outer).tolist(), np.asarray(inner).tolist(), strict=True))
    if made != wanted:
        missing = sorted(set(wanted) - set(made))[:1] or [made[0]]
        faults.append(f"the producer's copies of A's k tile are not its {copy.count} chunks once each (row {missing[0][0]}, "
                      f"k {missing[0][1]} {'never copied' if set(wanted) - set(made) else 'copied twice or outside'})")
    moved = fragment_mismatch("wgmma", loop.fragment, loop.accumulator_groups())
    if moved is not None:
        faults.append(moved)
    return faults


def split_pass_faults(loop: WgmmaMainLoop) -> list[str]:
    """An f32 A split by the consumers in place (`a_convert`), on the 16-byte units of the stage's A buffer: the
    producer's copies (`a_landed_offset` of each chunk `a_copy_row`, `a_copy_k` make) put each half-chunk in its own
    unit; each consumer thread's chunks (`convert_source`) cover a slab once and it reads each chunk's halves where
    the producer's copies put them; each warpgroup writes its parts (the stage tile's slot, lo `lo_offset` after it)
    only into units it alone reads (another warpgroup's reads are not ordered against its writes)."""
    ops = loop.operands
    landed: dict[int, tuple[int, int, int]] = {}
    ptid = np.arange(loop.warpgroup_size, dtype=np.int64)
    for j in range(loop.producer_copies()):
        rows = np.broadcast_to(np.asarray(loop.a_copy_row(loop.producer_thread(ptid), j)), ptid.shape)
        ks = np.broadcast_to(np.asarray(loop.a_copy_k(loop.producer_thread(ptid))), ptid.shape)
        for i, k in zip(rows.tolist(), ks.tolist(), strict=True):
            for half in (0, 1):
                at = int(loop.a_landed_offset(i, k, half))
                if at % 16 or not 0 <= at <= 2 * ops.a_tile.bytes - 16:
                    return [f"the producer copies A's chunk (row {i}, k {k}) to byte {at}, outside its stage buffer "
                            "or unaligned"]
                if at // 16 in landed:
                    return [f"the producer copies A's chunks {landed[at // 16][:2]} and ({i}, {k}) to one 16-byte unit"]
                landed[at // 16] = (i, k, half)
    faults = half_faults(loop)
    n = loop.convert_chunks()
    ctid = np.arange(loop.warpgroup_size, dtype=np.int64)[:, None]
    ri, ki = (np.broadcast_to(np.asarray(x, dtype=np.int64), (loop.warpgroup_size, n)).ravel()
              for x in loop.convert_source(ctid, np.arange(n, dtype=np.int64)[None, :]))
    if sorted(zip(ri.tolist(), ki.tolist(), strict=True)) != sorted((r, k) for r in range(64) for k in range(0, 64, 8)):
        faults.append("the consumers' chunks (`convert_source`) do not cover a slab's 64 rows × 64 k once each")
    readers: dict[int, int] = {}
    writes: dict[int, list[int]] = {}
    for cw in range(loop.consumers):
        for q in range(ops.slabs):
            for r, k in zip(ri.tolist(), ki.tolist(), strict=True):
                i = int(ops.slab_row(cw, q)) + r
                for half in (0, 1):
                    at = int(loop.a_staged_offset(i, k, half))
                    if landed.get(at // 16) != (i, k, half):
                        return [*faults, f"consumer {cw} reads the A tile's chunk tile[{i}, {k}] (row, k) at byte "
                                         f"{at}, where the producer copied {landed.get(at // 16, 'nothing')} (row, k, half)"]
                    readers[at // 16] = cw
                hi = int(ops.a_copy.byte_offset(i, k))
                writes.setdefault(cw, []).extend((hi // 16, (hi + loop.lo_offset) // 16))
    return faults + foreign_writes(writes, readers)


def half_faults(loop) -> list[str]:
    """An f32 chunk copied raw as two 16-byte halves: the halves' first floats (`half_source`) take the chunk's 8
    floats once each, half 0 the first 4 (the consumers split half 0's floats as the chunk's first)."""
    taken = [int(loop.half_source(h)) + i for h in (0, 1) for i in range(4)]
    if taken != list(range(8)):
        return [f"the two halves of an f32 chunk copy its floats {taken}, not 0..7 once each in order"]
    return []


def foreign_writes(writes: dict[int, list[int]], readers: dict[int, int]) -> list[str]:
    """An in-place pass's writes (16-byte units, by consumer warpgroup) into a unit the writer does not read itself:
    another warpgroup's chunk, or bytes that are not the pass's (its barrier orders the writer's own reads only)."""
    for cw, units in writes.items():
        foreign = [u for u in units if readers.get(u) != cw]
        if foreign:
            return [f"consumer {cw} writes A's parts into byte {foreign[0] * 16}, which it does not read itself "
                    "(another warpgroup's chunk, or not A's: its barrier does not order that)"]
    return []


def _wgmma_faults(name: str, lw: GroupedLowering, mem: Memory) -> None:
    """The wgmma loop's shared-memory operands, routed through the contraction path's maps
    (habu.prove.smem_route: the producer's cp.async stores, TMA's swizzle, the descriptors' reads): the
    kernel multiplies the tile product only where the route is the identity."""
    if not lw.uses_wgmma:
        return
    if lw.wgmma is None:
        mem.fault(f"{name}: the wgmma main loop has no stage maps for this tile")
        return
    loop = lw.wgmma
    if loop.a_parts == 2:  # an f32 A: its lo tile right after the hi tile, inside the stage's A buffer
        a0 = next(b for b in loop.layout.buffers if b.name == "A0")
        tile = loop.operands.a_tile.bytes
        if loop.lo_offset != tile or 2 * tile > a0.size:
            mem.fault(f"{name}: A's low parts at byte {loop.lo_offset} of its {a0.size}-byte stage buffer overlap "
                      f"the high parts' {tile} bytes or leave the buffer")
    if lw.pair is not None:  # the second weights' box lands where the consumers read them: row bn of B's tile
        load = loop.ring.load("B")
        lands = load.box_bytes if load is not None and load.boxes == 2 else None
        if loop.b2_offset != lands or loop.second_b_start() != lands:
            mem.fault(f"{name}: the second weights' box lands at byte {loop.b2_offset} of the stage's B tile, its "
                      f"reads start at byte {loop.second_b_start()} (the second of the ring's two boxes: {lands})")
    for fault in wgmma_thread_faults(loop) + tma_landing_faults(loop.ring, loop.operands) + \
            (split_pass_faults(loop) if loop.a_convert else []):
        mem.fault(f"{name}: {fault}")
    route = wgmma_route(loop.operands)
    for fault in route.faults:
        mem.fault(f"{name}: {fault}")
    if not route.identity:
        mem.fault(f"{name}: the wgmma operands' shared-memory route is not the tile's product (an element "
                  "multiplied at another row, column or k, or twice)")


def run_grouped(name: str, lw: GroupedLowering, sizes: Mapping[str, int], mem: Memory, blocks,
                keep: np.ndarray | None = None) -> None:
    """Run the blocks `blocks`, (mt, nt) pairs; the blocks of one row tile together (one read of A)."""
    _wgmma_faults(name, lw, mem)
    _mma_faults(name, lw, mem)
    offs = group_offsets(lw, sizes, mem)
    starts = tile_starts(lw, offs)
    by_row_tile: dict[int, list[int]] = {}
    for mt, nt in blocks:
        by_row_tile.setdefault(int(mt), []).append(int(nt))
    for mt, nts in by_row_tile.items():
        _run_row_tile(name, lw, sizes, mem, offs, starts, mt, nts)


def _run_row_tile(name: str, lw: GroupedLowering, sizes: Mapping[str, int], mem: Memory, offs: list[int],
                  starts: list[int], mt: int, nts: list[int]) -> None:
    """The blocks (mt, nt) for every nt of `nts`, as each runs: its rows, its column tile, every k step."""
    f = mem.field
    k = lw.kernel
    if not bool(lw.live(mt, starts[-1])):
        return
    group, m = lw.decode(mt, starts, _where)
    group, m = int(group), int(m)

    def where(bad: np.ndarray) -> str:
        return f"row tile {mt} (group {group}, its tile {m}), column tiles {nts[0]}.."

    i = np.arange(k.bm, dtype=np.int64)
    j = np.arange(k.bn, dtype=np.int64)
    rows = np.asarray(lw.row(offs[group], m, i), dtype=np.int64)
    inside = np.asarray(lw.row_inside(rows, offs[min(int(lw.group_end(group)), len(offs) - 1)]), dtype=bool)
    cols = np.concatenate([np.asarray(lw.column(nt, j), dtype=np.int64) for nt in nts])
    steps = int(lw.k_steps(sizes))
    kk = np.arange(k.bk, dtype=np.int64)
    # the k tile each k step multiplies: the ring's delivery (habu.prove.pipeline; None: a stage read before
    # any tile of this output tile landed, poison) on the wgmma loop, the steps in order on mma.sync
    first = f"{lw.out.tensor}[{int(rows[0])}, {int(cols[0])}] (routed row, column) and the rest of its tile"
    tiles = _delivered_tiles(name, lw, steps, mem, first)
    ks = np.concatenate([np.asarray(lw.k_index(max(t or 0, 0), kk), dtype=np.int64) for t in tiles]) \
        if steps else kk[:0]
    live_rows = rows[inside]
    if not len(live_rows):
        return
    a = read(name, lw.a, {"r": live_rows[:, None], "k": ks[None, :]}, sizes, mem, lw.index_width, where) \
        if len(ks) else None
    stale = np.repeat(np.array([t is None for t in tiles], dtype=bool), k.bk)
    if a is not None and stale.any():
        a = np.where(stale[None, :], mem.poison(live_rows[:, None] * 7919 + ks[None, :]), a)

    def weights(w_accesses) -> np.ndarray:
        """W at the block's columns and the k steps' k: on the wgmma loop, each k tile's TMA box at the
        origin the lowering gives (`w_box_origin`), zero past W's bounds as the tensor map fills it; several
        weights (a pair by one instruction): each block's boxes one after the other, as the stage's B tile
        holds them."""
        if lw.wgmma is None:
            return read(name, w_accesses[0], {"g": np.int64(group), "n": cols[:, None], "k": ks[None, :]}, sizes,
                        mem, lw.index_width, where)
        loop = lw.wgmma
        box_rows = np.arange(loop.bn if loop.b2_offset else loop.w_load.box_rows, dtype=np.int64)
        k0s = np.array([lw.k_index(max(t or 0, 0), 0) for t in tiles], dtype=np.int64)  # each k tile's first k
        width = len(tiles) * k.bk
        # the tile rows the boxes fill; a row none fills holds poison (stale shared memory)
        filled = np.zeros(k.bn, dtype=bool)
        for box in range(loop.w_boxes):
            at = int(loop.w_box_rows(box)) + box_rows
            filled[at[(at >= 0) & (at < k.bn)]] = True
        stale = None if filled.all() else \
            mem.poison(np.arange(k.bn * width, dtype=np.int64) * 31 + 17).reshape(k.bn, width)
        parts = []
        for nt in nts:
            n0 = np.int64(lw.column(nt, 0))
            for w_access in w_accesses:
                tile = np.zeros((k.bn, width), dtype=np.int64) if stale is None else stale.copy()
                for box in range(loop.w_boxes):
                    # box `box` of every k tile (an n-major W: 64 columns each) at its origin, into the tile rows
                    # it fills: one read over the k tiles, (box rows, k tiles, bk)
                    o = loop.w_box_origin(np.int64(group), n0, k0s, box)
                    along = {a: np.broadcast_to(np.asarray(o[a], dtype=np.int64), k0s.shape)[None, :, None]
                             for a in ("g", "n", "k")}
                    got = read(name, w_access, {"g": along["g"], "n": along["n"] + box_rows[:, None, None],
                                                "k": along["k"] + kk[None, None, :]},
                               sizes, mem, lw.weights_width, where)  # TMA: the copy engine's addresses
                    at = int(loop.w_box_rows(box)) + box_rows
                    keep = (at >= 0) & (at < k.bn)
                    got = np.broadcast_to(got, (len(box_rows), len(k0s), k.bk)).reshape(len(box_rows), width)
                    tile[at[keep]] = got[keep]
                parts.append(tile)
        return np.concatenate(parts, axis=0)

    route = _route(lw)
    moves = epilogue_moves(lw.mma) if lw.mma is not None and not lw.uses_wgmma else \
        wgmma_epilogue_moves(lw.wgmma) if lw.wgmma is not None else None
    stale_a = producer_uncopied(lw.wgmma) if lw.wgmma is not None else None

    def accumulate(w_accesses) -> np.ndarray:
        """Σ k A[row k] · W[group col k] over the block's rows and the accumulator's columns (each weights'
        box of every block), every k step; through the loop's shared-memory route where it is not the plain
        tile product (each warp multiplies the elements its copies, reads and accumulator map give it)."""
        width = k.bn * len(w_accesses)
        if a is None:
            return np.zeros((len(live_rows), width * len(nts)), dtype=np.int64)
        w = weights(w_accesses)
        a_b = np.ascontiguousarray(np.broadcast_to(a, (len(live_rows), len(ks))))
        w_b = np.ascontiguousarray(np.broadcast_to(w, (width * len(nts), len(ks))))
        if route is not None and not (route.identity and moves is None and stale_a is None):
            # (A's elements no producer thread copied: stale shared memory, poison)
            return _routed_product(f, route, moves, a_b, w_b, inside, k.bm, width, k.bk, len(nts), stale_a,
                                   mem.poison)
        return f.contract2(a_b, w_b, "ik", "jk", "ij")

    def scaled(out: np.ndarray, scale) -> np.ndarray:
        return out if scale is None else (out * np.asarray(_scale(f, scale, sizes), dtype=np.int64)) % f.p

    if lw.pair is not None and lw.wgmma is not None and lw.wgmma.one_pair_instruction:
        # one instruction over both boxes: the epilogue reads each product's group j at `pair_group(j, which)`
        both, loop = accumulate((lw.w, lw.pair.w)), lw.wgmma
        jj = np.arange(k.bn, dtype=np.int64)

        def pick(which: int) -> np.ndarray:
            step = loop.fragment.col_step
            at = step * np.asarray(loop.pair_group(jj // step, which), dtype=np.int64) + jj % step
            ok = np.tile((at >= 0) & (at < 2 * k.bn), len(nts))
            at = np.concatenate([b * 2 * k.bn + at for b in range(len(nts))])
            return np.where(ok[None, :], both[:, np.where(ok, at, 0)], mem.poison(at)[None, :])

        first, second = scaled(pick(0), lw.scale), scaled(pick(1), lw.pair.scale)
    else:
        first = scaled(accumulate((lw.w,)), lw.scale)
        second = scaled(accumulate((lw.pair.w,)), lw.pair.scale) if lw.pair is not None else None
    acc = first
    if lw.pair is not None:  # the node of both from the two accumulators
        pair = lw.pair
        acc = np.broadcast_to(eval_pointwise(pair.node.rhs, lambda ld: first if ld.tensor == pair.first else second,
                                             f, sizes), first.shape)
    if lw.row_scale is not None:
        p_row = read(name, lw.row_scale, {"r": live_rows[:, None]}, sizes, mem, lw.index_width, where)
        acc = f.op("mul", [np.broadcast_to(np.asarray(p_row, dtype=np.int64), acc.shape), acc])
    if lw.epilogue_vectors is not None and lw.wgmma is not None:  # the row's lanes trade pairs, store vectors
        (held_r, held_c, stored_r, stored_c), faults = vector_moves(lw.wgmma, lw.epilogue_vectors)
        for fault in faults:
            mem.fault(f"{name}: {fault}")
        full = np.zeros((k.bm, acc.shape[1]), dtype=np.int64)
        full[inside] = acc
        moved = mem.poison(np.arange(full.size, dtype=np.int64)).reshape(full.shape)  # a cell nothing stores
        ok = (stored_r >= 0) & (stored_r < k.bm) & (stored_c >= 0) & (stored_c < k.bn) & \
            (held_r >= 0) & (held_r < k.bm) & (held_c >= 0) & (held_c < k.bn)  # (the faults name the others)
        for b in range(len(nts)):
            moved[stored_r[ok], b * k.bn + stored_c[ok]] = full[held_r[ok], b * k.bn + held_c[ok]]
        acc = moved[inside]
    at = {"r": live_rows[:, None], "n": cols[None, :]}
    if lw.store is Store.ATOMIC_ADD:
        # atomicAdd onto the target's memory, which holds its prior contents (an input of the model):
        # every value lands, duplicates included, in any order
        target = lw.out.tensor
        if target not in mem.written:
            mem.written[target] = WrittenTensor(target, int(lw.out.numel(sizes)), f.p, True, mem.inputs.get(target))
        write(name, lw.out, at, acc, sizes, mem, lw.index_width, True, None, where)
        return
    write(name, lw.out, at, acc, sizes, mem, lw.index_width, False, None, where)


def _route(lw: GroupedLowering) -> Route | None:
    """The main loop's shared-memory route (None where its maps are missing: the check faults on that)."""
    if lw.wgmma is not None:
        return wgmma_loop_route(lw.wgmma)
    if lw.mma is not None and not lw.uses_wgmma:
        return grouped_mma_route(lw.mma)
    return None


def _routed_product(f: PrimeField, route: Route, moves, a: np.ndarray, w: np.ndarray, inside: np.ndarray, bm: int,
                    bn: int, bk: int, blocks: int, stale: np.ndarray | None = None, poison=None) -> np.ndarray:
    """The block's accumulators as its warps compute them: warp by warp, k tile by k tile, A's element
    (a_mn, a_k) of the k tile times W's (b_mn, b_k), summed into the warp's rows and columns (an element no
    warp computes stays 0, one two warps compute holds both sums). `a`: the live rows' values (masked rows
    are zeros in shared memory), `w`: the blocks' columns, over every k step."""
    tiles = a.shape[1] // bk
    a_full = np.zeros((bm, a.shape[1]), dtype=np.int64)
    a_full[inside] = a
    if stale is not None:  # A's tile elements no copy wrote: whatever shared memory held, in every k tile
        where = np.tile(stale, (1, tiles))
        a_full = np.where(where, poison(np.arange(a_full.size, dtype=np.int64).reshape(a_full.shape) * 7919 + 13),
                          a_full)
    acc = np.zeros((bm, blocks * bn), dtype=np.int64)
    for warp in route.warps:
        rows_ok = (warp.rows >= 0) & (warp.rows < bm)
        cols_ok = (warp.cols >= 0) & (warp.cols < bn)
        a_mn, b_mn = np.clip(warp.a_mn, 0, bm - 1), np.clip(warp.b_mn, 0, bn - 1)
        for b in range(blocks):
            for t in range(tiles):
                x = a_full[a_mn, t * bk + warp.a_k][rows_ok]
                y = w[b * bn + b_mn, t * bk + warp.b_k][cols_ok]
                part = f.contract2(np.ascontiguousarray(x), np.ascontiguousarray(y), "ik", "jk", "ij")
                at = np.ix_(warp.rows[rows_ok], b * bn + warp.cols[cols_ok])
                acc[at] = (acc[at] + part) % f.p
    if moves is not None:  # the epilogue: each register's value stored where the lowering's map says
        held_r, held_c, stored_r, stored_c = moves
        ok = (stored_r >= 0) & (stored_r < bm) & (stored_c >= 0) & (stored_c < bn)
        out = np.zeros_like(acc)
        for b in range(blocks):
            out[stored_r[ok], b * bn + stored_c[ok]] = acc[held_r[ok], b * bn + held_c[ok]]
        acc = out
    return acc[inside]


# ----------------------------------------------------------------------------- the grouped kind


WALK_BLOCKS = (1, 3, 132)  # persistent grids the walk is run over (one block, a few, an H200's SMs)


def walked(loop: WgmmaMainLoop | GroupedWgradLowering, tiles: int) -> list[int]:
    """The tiles (a weight gradient's work items) the persistent blocks visit, each block walking from `loop.walk`'s
    first tile below its bound by its step, over grids of `WALK_BLOCKS` blocks (at most one per tile): the tiles of the largest grid, in
    order; a tile two blocks visit appears twice, one none visits not at all (the checks then name it)."""
    for blocks in WALK_BLOCKS:
        nb = max(1, min(blocks, tiles))
        visits = sorted(t for b in range(nb) for t in range(*(int(x) for x in loop.walk(b, nb, tiles))))
        if visits != list(range(tiles)):
            return visits
    return list(range(tiles))


def grid_blocks(lw: GroupedLowering, sizes: Mapping[str, int]) -> list[tuple[int, int]]:
    """The (row tile, column tile) of every block of the grid, as the kernel decodes its block index: the
    mma.sync loop's (blockIdx.x, blockIdx.y), the wgmma loop's band order (`WgmmaMainLoop.tile_of`)."""
    gx, gy = (int(x) for x in lw.grid(sizes))
    if lw.wgmma is not None:
        return [(int(mt), int(nt)) for mt, nt in (lw.wgmma.tile_of(lin, gx, gy) for lin in walked(lw.wgmma, gx * gy))]
    return [tuple(int(t) for t in lw.block_tile(bx, by)) for by in range(gy) for bx in range(gx)]  # type: ignore[misc]


def _everything(lw: GroupedLowering, sizes: Mapping[str, int]) -> tuple[object, tuple[np.ndarray, ...], str]:
    """Every block of the grid (the offsets depend on the drawn grouping, so no block stands for another),
    and every element of the output."""
    gx, gy = (int(x) for x in lw.grid(sizes))
    blocks = grid_blocks(lw, sizes)
    box = tuple(np.arange(sizes[e]) for e in lw.out.extents)  # (#R, #N); a scatter's target, all of it
    return blocks, box, f"all {gx} × {gy} blocks (row tiles of any grouping × column tiles)"


def _box(lw: GroupedLowering, box: tuple[np.ndarray, ...], sizes: Mapping[str, int]) -> tuple[object, object, str]:
    """The blocks a later kernel's demand needs: every row tile (the drawn grouping decides which rows a tile
    holds) of each column tile holding a demanded column (`lw.column`). A general kernel after it compares a few
    sampled columns (dX's scatter-add after its two grouped products: 4 of 24 column tiles at Mixtral's
    witness), so the tiles no checked element depends on are not run."""
    blocks, _, text = _everything(lw, sizes)
    at = next((i for i, p in enumerate(lw.out.positions) if p.kind == "axis" and p.axis == "n"), None)
    if at is None or at >= len(box):
        return blocks, None, text
    want = np.asarray(box[at], dtype=np.int64)
    j = np.arange(lw.kernel.bn, dtype=np.int64)
    tiles = sorted({nt for _, nt in blocks})
    needed = {nt for nt in tiles if np.isin(np.asarray(lw.column(nt, j), dtype=np.int64), want).any()}
    if len(needed) == len(tiles):
        return blocks, None, text
    chosen = [(mt, nt) for mt, nt in blocks if nt in needed]
    return chosen, None, (f"{len(chosen)} blocks: every row tile of column tiles {sorted(needed)} of {len(tiles)} "
                          "(the columns a later kernel reads)")


def _tiled_axes(name: str, lw: GroupedLowering) -> list[TileAxis]:
    """The column tiles and the k steps. Not the row tiles: a group's tiles depend on the drawn grouping,
    not on #R's classes, and three tiles of rows would make the reference gather #R × #N × #K weights
    (minutes at Mixtral's #H); groups longer than a tile, empty ones and one holding every row are
    checked by tests/prove/test_grouped.py's groupings."""
    k = lw.kernel
    return [TileAxis(name, "n", lw.n, k.bn), TileAxis(name, "k", lw.k, k.bk)]


def _offset_tensors(lw: GroupedLowering) -> tuple[str, ...]:
    """The tensors the kernel forms element offsets of in its index width: A, the output, the row factor,
    the grouping and the gather and scatter tables; W (and a pair's second weights) only on the mma.sync
    loop (the wgmma loop gives TMA W's box coordinates: `GroupedLowering.weights_width`)."""
    accesses = [lw.a, lw.out, *((lw.row_scale,) if lw.row_scale is not None else ())]
    if lw.weights_width == lw.index_width:
        accesses += [lw.w, *((lw.pair.w,) if lw.pair is not None else ())]
    tables = [p.table for acc in accesses for p in acc.positions if p.kind == "gather"]
    return tuple(dict.fromkeys([*(acc.tensor for acc in accesses), lw.groups, *tables]))


register_kind(GroupedLowering, KindProof(run=run_grouped, final_selection=_everything, box_selection=_box,
                                         tiled_axes=_tiled_axes, offset_tensors=_offset_tensors))
