"""The finite-field interpreter of the grouped weight gradient (habu/lower/grouped_wgrad.py): the blocks of the
first, second and last output tile along #M and #N of every group (`_sampled`: the classes the witness keeps; a
group's rows are its own, so no group stands for another), each as the kernel decodes its block index, the
group's rows found by the lowering's binary search over E's values, its k tiles as the ring delivers them
(habu.prove.pipeline), masked at the group's end, the producer's stores checked against the stage tile's layout
and the tiles read back through the consumers' descriptors (habu.prove.smem_route on the contraction path's
maps), and the tile added into O[g].

An f32 A is two bf16 parts on the GPU (hi = bf16(a·P[r]), lo = bf16(a·P[r] − hi)); over the field the hi part
holds the exact value and the lo part zero, so a consumer that reads a part's block twice, or another row's,
changes the result (the GPU tests check the split itself with values bf16 cannot hold)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

import numpy as np

from habu.lower.grouped_wgrad import VECTOR, WGRAD_BK, GroupedWgradLowering, WgradLoop
from habu.prove.fragments import fragment_mismatch
from habu.prove.interp import Memory, eval_pointwise, read, write
from habu.prove.interp_grouped import (
    foreign_writes,
    group_offsets,
    half_faults,
    walked,
    warpgroup_decode_faults,
)
from habu.prove.kinds import KindProof, TileAxis, register_kind, sample_tiles
from habu.prove.pipeline import delivered
from habu.prove.smem_route import Route, wgmma_route
from habu.prove.virtual import WrittenTensor


def loop_faults(loop: WgradLoop) -> list[str]:
    """The thread maps over every thread: the warpgroup decode, each producer chunk of A's and B's k tiles made
    once (`producer_thread`, `chunk`,
    `a_source`, `b_source` cover the tile), A's parts' columns a permutation of the stage tile's
    (`a_stored_column`), every store 16-byte aligned inside its tile, the consumers' accumulator map against
    the PTX ISA's wgmma layout."""
    faults = warpgroup_decode_faults(loop)
    ptid = np.asarray(loop.producer_thread(np.arange(loop.warpgroup_size, dtype=np.int64)))[:, None]
    for side, chunks, source, cols in (("A", loop.a_chunks(), loop.a_source, loop.bm),
                                       ("B", loop.b_chunks(), loop.b_source, loop.bn)):
        j = np.arange(-(-chunks // loop.warpgroup_size), dtype=np.int64)[None, :]
        made = np.asarray(loop.chunk(ptid, j), dtype=np.int64).ravel()
        made = made[made < chunks]
        if sorted(made.tolist()) != list(range(chunks)):
            faults.append(f"the producer's chunks of {side}'s k tile are not its {chunks} chunks once each")
        k, c = (np.asarray(x, dtype=np.int64) for x in source(np.arange(chunks, dtype=np.int64)))
        cells = sorted(zip(k.tolist(), c.tolist(), strict=True))
        want = sorted((kk, cc) for kk in range(WGRAD_BK) for cc in range(0, cols, VECTOR))
        if cells != want:
            faults.append(f"{side}'s chunks do not cover its {WGRAD_BK} × {cols} k tile in chunks of {VECTOR}")
    m = np.arange(loop.bm, dtype=np.int64)
    stored = np.concatenate([np.asarray(loop.a_stored_column(m, p), dtype=np.int64) for p in range(loop.parts)])
    if sorted(stored.tolist()) != list(range(loop.parts * loop.bm)):
        faults.append("A's parts are not kept at distinct columns of the stage tile (a part overwrites another)")
    ops = loop.operands
    k = np.arange(WGRAD_BK, dtype=np.int64)[:, None]
    a_cols, b_cols = m[None, ::VECTOR], np.arange(0, loop.bn, VECTOR, dtype=np.int64)[None, :]
    # where the producer stores each chunk (as the emitter prints it) against where the route's fill keeps the
    # chunk's first element (the stage tile's layout: `StageCopy.byte_offset` of its stored column)
    for side, printed, kept, tile in (
            ("A", [np.asarray(loop.a_store_offset(a_cols, k, p)) for p in range(loop.parts)],
             [np.asarray(ops.a_copy.byte_offset(loop.a_stored_column(a_cols, p), k)) for p in range(loop.parts)],
             ops.a_tile),
            ("B", [np.asarray(loop.b_store_offset(b_cols, k))], [np.asarray(ops.b_copy.byte_offset(b_cols, k))],
             ops.b_tile)):
        at = np.concatenate([np.broadcast_to(o, np.broadcast_shapes(o.shape, (WGRAD_BK, 1))).ravel() for o in printed])
        want = np.concatenate([np.broadcast_to(o, np.broadcast_shapes(o.shape, (WGRAD_BK, 1))).ravel() for o in kept])
        if ((at % 16) != 0).any() or (at < 0).any() or (at + 16 > tile.bytes).any():
            faults.append(f"a producer store of {side}'s chunk leaves its stage tile or is not 16-byte aligned")
        elif not np.array_equal(at, want):
            i = int(np.nonzero(at != want)[0][0])
            faults.append(f"the producer stores a chunk of {side} at byte {int(at[i])} of its stage tile, which keeps "
                          f"that chunk at byte {int(want[i])}")
    if loop.a_convert:
        faults += convert_faults(loop)
    rows = sorted(int(loop.acc_row(cw, q)) + i for cw in range(loop.consumers) for q in range(loop.slabs)
                  for i in range(64))
    if rows != list(range(loop.bm)):
        faults.append(f"the consumers' accumulators (`acc_row`) do not hold the tile's {loop.bm} rows once each")
    moved = fragment_mismatch("wgmma", loop.fragment, loop.bn // loop.fragment.col_step)
    if moved is not None:
        faults.append(moved)
    groups = loop.bn // loop.fragment.col_step  # the epilogue's rounds take each 8-column group once
    taken = sorted(int(loop.epilogue_group(r, b)) for r in range(loop.epilogue_rounds())
                   for b in range(loop.epilogue_batch))
    if taken != list(range(groups)):
        faults.append(f"the epilogue's rounds (`epilogue_group`) do not take a thread's {groups} column groups once "
                      "each")
    return faults


def convert_faults(loop: WgradLoop) -> list[str]:
    """The consumers' in-place pass over a staged A (`a_convert`), on the 16-byte units of the stage's A tile: the
    producer's copies (`a_landed_offset` of each chunk it makes, `a_source`) put each half-chunk in its own unit;
    each consumer thread's chunks (`convert_source`) cover its slabs once, and it reads each chunk's halves where the
    producer's copies put them; each warpgroup writes its parts (`a_store_offset`) only into units it alone reads
    (another warpgroup's reads or B's tile are not ordered against its writes: its barrier is its own)."""
    faults: list[str] = half_faults(loop) if loop.parts == 2 else []
    halves = 2 if loop.parts == 2 else 1
    landed: dict[int, tuple[int, int, int]] = {}  # unit -> (m, k, half) the producer's copy puts there
    for ch in range(loop.a_chunks()):
        k, m = (int(x) for x in loop.a_source(ch))
        for half in range(halves):
            at = int(loop.a_landed_offset(m, k, half))
            if at % 16 or not 0 <= at <= loop.operands.a_tile.bytes - 16:
                return [f"the producer copies A's chunk ({m}, {k}) to byte {at}, outside its stage tile or unaligned"]
            if at // 16 in landed:
                return [f"the producer copies A's chunks {landed[at // 16][:2]} and ({m}, {k}) to one 16-byte unit"]
            landed[at // 16] = (m, k, half)
    n = loop.convert_chunks()
    ctid = np.arange(loop.warpgroup_size, dtype=np.int64)[:, None]
    j = np.arange(n, dtype=np.int64)[None, :]
    ki, mi = (np.broadcast_to(np.asarray(x, dtype=np.int64), (loop.warpgroup_size, n)).ravel()
              for x in loop.convert_source(ctid, j))
    if sorted(zip(ki.tolist(), mi.tolist(), strict=True)) != \
            sorted((k, m) for k in range(WGRAD_BK) for m in range(0, 64, VECTOR)):
        faults.append("the consumers' chunks (`convert_source`) do not cover a slab's 64 × 64 in chunks of 8 once each")
    readers: dict[int, int] = {}  # unit -> the consumer warpgroup that reads it
    writes: dict[int, list[int]] = {}
    for cw in range(loop.consumers):
        for q in range(loop.slabs):
            for k, mm in zip(ki.tolist(), mi.tolist(), strict=True):
                m = int(loop.acc_row(cw, q)) + mm
                for half in range(halves):
                    at = int(loop.a_staged_offset(m, k, half) if loop.parts == 2 else loop.a_store_offset(m, k, 0))
                    if landed.get(at // 16) != (m, k, half):
                        return [*faults, f"consumer {cw} reads the A tile's chunk tile[{k}, {m}] (k, m) at byte {at}, "
                                         f"where the producer copied {landed.get(at // 16, 'nothing')} (m, k, half)"]
                    readers[at // 16] = cw
                writes.setdefault(cw, []).extend(int(loop.a_store_offset(m, k, p)) // 16 for p in range(loop.parts))
    return faults + foreign_writes(writes, readers)


# the k-tile counts of the work items a producer's index ring runs through: blocks of one item (one k tile, two,
# more than two passes of the ring) and a persistent block's walk (an empty group's item among them)
INDEX_WALKS = ((1,), (2,), (9,))
PERSISTENT_WALKS = ((3, 0, 9, 1, 2), (1, 1, 4))


def index_faults(lw: GroupedWgradLowering) -> list[str]:
    """A gather's indices staged ahead (`staged_index`), run over walks of work items (`INDEX_WALKS`, and
    `PERSISTENT_WALKS` where the blocks persist) as the emitter orders the producer's work. Each item: the copies of
    `index_tile(s)` for s = −index_depth .. −1, a cp.async group each; at step kt the wait leaving `index_wait()`
    groups in flight, the read of `index_slot(kt)`, then the copies of `index_tile(kt)` into its slot and the step's
    group; a tile's copies only where `index_staged` (a group is closed regardless). Each step must read its own k
    tile's indices from a copy the wait has completed; no copy may be issued into a slot whose earlier copy may still
    be in flight (the two land in either order: a copy past one item's k tiles could land over the next item's) or
    into the slot its own step read (a masked row's index is read and never used, so nothing orders that read before
    the copy); each thread's entries (`index_entry`) are distinct, aligned, and in the ring past the stage tiles and
    barriers."""
    loop = lw.loop
    assert loop is not None
    sides = [side for side in "AB" if lw.staged_index(side)]
    if not sides:
        return []
    faults: list[str] = []
    if loop.index_wait() < 0:
        return [f"the producer waits for {loop.index_wait()} cp.async groups in flight (`index_wait`)"]
    for items in INDEX_WALKS + (PERSISTENT_WALKS if loop.persistent else ()):
        fault = _IndexRingRun(loop, items).fault()
        if fault is not None:
            return [fault]
    end = max(x.offset + x.size for x in loop.layout.buffers)
    usable = loop.smem_total - (loop.layout.total - end)  # past the aligned base: the request less its slack
    seen: set[int] = set()
    for side, width, count in zip(loop.index_sides, loop.index_widths, loop.index_counts, strict=True):
        sl = np.arange(loop.index_slots, dtype=np.int64)[:, None, None]
        pt = np.arange(loop.warpgroup_size, dtype=np.int64)[None, :, None]
        j = np.arange(count, dtype=np.int64)[None, None, :]
        at = np.broadcast_to(np.asarray(loop.index_entry(side, sl, pt, j), dtype=np.int64),
                             (loop.index_slots, loop.warpgroup_size, count)).ravel()
        if (at % width).any() or (at < end).any() or (at + width > usable).any():
            faults.append(f"an entry of {side}'s staged indices is unaligned, overlaps the stage tiles or barriers "
                          f"(which end at byte {end}), or leaves the shared memory")
        cells = {int(x) // width * width + b for x in at.tolist() for b in range(width)}
        if len(cells) != len(at) * width or cells & seen:
            faults.append(f"two of {side}'s staged indices' entries (`index_entry`) share bytes")
        seen |= cells
    return faults


class _IndexRingRun:
    """One producer thread's index ring over a walk of work items (`items`: their k-tile counts), in the emitter's
    order (`index_faults`): each slot's last copy (item, k tile, group), the groups closed and those a wait has
    completed."""

    def __init__(self, loop: WgradLoop, items: tuple[int, ...]):
        self.loop, self.items = loop, items
        self.slot: dict[int, tuple[int, int, int]] = {}
        self.groups = self.done = 0

    def copy(self, item: int, t: int, k_tiles: int, step: str) -> str | None:
        """The copies of k tile t's indices (where `index_staged`), or the fault of an earlier copy of the slot that
        may still be in flight."""
        if not self.loop.index_staged(t, k_tiles):
            return None
        at = int(self.loop.index_slot(t))
        if at in self.slot and self.slot[at][2] >= self.done:
            before = self.slot[at]
            return (f"the producer copies k tile[{t}]'s indices ({step} of item {item} of {self.items}) into slot "
                    f"{at}, where its copy of item {before[0]}'s k tile[{before[1]}] may still be in flight")
        self.slot[at] = (item, t, self.groups)
        return None

    def fault(self) -> str | None:
        loop = self.loop
        for item, k_tiles in enumerate(self.items):
            for s in range(-loop.index_depth, 0):
                if (fault := self.copy(item, int(loop.index_tile(s)), k_tiles, "before the loop")) is not None:
                    return fault
                self.groups += 1
            for kt in range(k_tiles):
                self.done = max(self.done, self.groups - loop.index_wait())
                held = self.slot.get(int(loop.index_slot(kt)))
                if held is None or held[:2] != (item, kt):
                    return (f"the producer copies the rows of k tile[{kt}] through the gather indices of k tile"
                            f"[{None if held is None else held[1]}] (`index_tile`, `index_slot`; item {item} of "
                            f"{self.items})")
                if held[2] >= self.done:
                    return (f"the producer reads k tile[{kt}]'s gather indices before their copy lands (`index_wait` "
                            f"{loop.index_wait()} leaves group {held[2]} in flight; item {item} of {self.items})")
                t = int(loop.index_tile(kt))
                if t <= kt:
                    return f"the producer stages the indices of k tile[{t}] at step {kt}, not a tile ahead (`index_tile`)"
                if loop.index_staged(t, k_tiles) and int(loop.index_slot(t)) == int(loop.index_slot(kt)):
                    return (f"the producer copies k tile[{t}]'s indices into the slot it reads k tile[{kt}]'s from at "
                            f"the same step (`index_slot`: {loop.index_slots} slots)")
                if (fault := self.copy(item, t, k_tiles, f"at step {kt}")) is not None:
                    return fault
                self.groups += 1
        return None


def walk_faults(lw: GroupedWgradLowering, sizes: Mapping[str, int]) -> list[str]:
    """The persistent blocks' walk (`walk`, run by `walked` over its grids of blocks, at most one a work item) visits every
    work item once, and `work_item` decodes the items onto every group's output tiles once each."""
    if lw.loop is None or not lw.loop.persistent:
        return []
    tiles, groups, items = int(lw.tiles(sizes)), int(sizes[lw.g]), int(lw.work_items(sizes))
    seen = Counter(walked(lw, items))
    bad = next((w for w in range(items) if seen[w] != 1), next(iter(set(seen) - set(range(items))), None))
    if bad is not None:
        return [f"the persistent blocks' walk (`walk`) visits work item[{bad}] {seen.get(bad, 0)} times (of {items} "
                "items)"]
    decoded = Counter((int(bx), int(g)) for bx, g in (lw.work_item(w, tiles) for w in range(items)))
    wrong = next(((bx, g) for g in range(groups) for bx in range(tiles) if decoded[(bx, g)] != 1), None)
    if wrong is not None or len(decoded) != items:
        return [f"the work items (`work_item`) decode onto group {wrong and wrong[1]}'s output tile[{wrong and wrong[0]}] "
                f"{decoded.get(wrong, 0)} times"]
    return []


def _rows_leave_tile(lw: GroupedWgradLowering) -> bool:
    """Whether some accumulator's rows (`acc_row`) leave the tile: the kernel would store another block's rows."""
    loop = lw.loop
    assert loop is not None
    return any(not 0 <= int(loop.acc_row(cw, q)) <= loop.bm - 64
               for cw in range(loop.consumers) for q in range(loop.slabs))


def _parts_values(loop: WgradLoop, a: np.ndarray) -> np.ndarray:
    """The stage tile's rows (parts·bm of them, shadow order) from A's values at (m, k): part 0 the value, part 1
    zero, each at the column `a_stored_column` keeps it."""
    out = np.zeros((loop.parts * loop.bm, a.shape[1]), dtype=np.int64)
    m = np.arange(loop.bm, dtype=np.int64)
    out[np.asarray(loop.a_stored_column(m, 0), dtype=np.int64)] = a
    return out


def _block(name: str, lw: GroupedWgradLowering, sizes: Mapping[str, int], mem: Memory, offs: list[int], route: Route,
           g: int, mt: int, nt: int) -> None:
    f, k, loop = mem.field, lw.kernel, lw.loop
    assert loop is not None
    lo, hi = offs[g], offs[min(int(lw.group_end(g)), len(offs) - 1)]
    steps = int(lw.k_tiles(lo, hi))
    if steps <= 0:
        return
    tiles, fault = delivered(loop.ring, steps)

    def where(bad: np.ndarray) -> str:
        return f"group {g}, tile ({mt}, {nt})"

    if fault is not None:
        mem.fault(f"while computing {lw.out.tensor}[{g}, {mt * k.bm}, {nt * k.bn}] and the rest of its tile: "
                  f"{name}'s k pipeline: {fault}")
    ms = np.asarray(lw.column_m(mt, np.arange(k.bm, dtype=np.int64)), dtype=np.int64)
    ns = np.asarray(lw.column_n(nt, np.arange(k.bn, dtype=np.int64)), dtype=np.int64)
    m_ok, n_ok = ms < sizes[lw.m], ns < sizes[lw.n]
    acc = np.zeros((k.bm, k.bn), dtype=np.int64)
    i = np.arange(WGRAD_BK, dtype=np.int64)
    for t in tiles:
        if t is None:  # a stage read before its tile landed: stale shared memory
            acc = (acc + mem.poison(np.arange(acc.size, dtype=np.int64) * 7919 + g).reshape(acc.shape)) % f.p
            continue
        a = np.zeros((k.bm, WGRAD_BK), dtype=np.int64)
        b = np.zeros((k.bn, WGRAD_BK), dtype=np.int64)
        for side in "AB":
            # the k tile whose chunks the producer puts in this stage: a copied side its step's, a side through
            # registers the one its registers loaded `register_depth − 1` steps before (`load_tile`)
            held = t if loop.copied_async(side) else int(loop.load_tile(t - loop.register_depth + 1))
            if not 0 <= held < steps:
                mem.fault(f"while computing {lw.out.tensor}[{g}, {mt * k.bm}, {nt * k.bn}]: the producer stores k "
                          f"tile {held} of {side} at step {t} of {steps} (`load_tile`), a tile it never loaded")
                continue
            rows = np.asarray(lw.row(lo, held, i), dtype=np.int64)
            inside = np.asarray(lw.row_inside(rows, hi), dtype=bool)
            live = rows[inside]
            if not len(live):
                continue
            if side == "A":
                av = read(name, lw.a, {"k": live[None, :], "m": np.where(m_ok, ms, 0)[:, None]}, sizes, mem,
                          lw.index_width, where)
                if lw.row_scale is not None:
                    p = read(name, lw.row_scale, {"k": live[None, :]}, sizes, mem, lw.index_width, where)
                    av = f.op("mul", [np.broadcast_to(av, (k.bm, len(live))), np.broadcast_to(p, (k.bm, len(live)))])
                a[:, inside] = np.where(m_ok[:, None], np.broadcast_to(av, (k.bm, len(live))), 0)
            else:
                bv = read(name, lw.b, {"k": live[None, :], "n": np.where(n_ok, ns, 0)[:, None]}, sizes, mem,
                          lw.index_width, where)
                b[:, inside] = np.where(n_ok[:, None], np.broadcast_to(bv, (k.bn, len(live))), 0)
        tile_a = _parts_values(loop, a)
        for cw in range(loop.consumers):
            for q in range(loop.slabs):
                r0 = int(loop.acc_row(cw, q))
                for part in range(loop.parts):
                    warp = route.warps[cw * loop.operands.slabs + int(loop.part_slab(q, part))]
                    x = tile_a[np.clip(warp.a_mn, 0, len(tile_a) - 1), warp.a_k]
                    y = b[np.clip(warp.b_mn, 0, k.bn - 1), warp.b_k]
                    part_sum = f.contract2(np.ascontiguousarray(x), np.ascontiguousarray(y), "ik", "jk", "ij")
                    acc[r0:r0 + 64] = (acc[r0:r0 + 64] + part_sum) % f.p
    if lw.scale is not None:
        acc = (acc * np.asarray(eval_pointwise(lw.scale, lambda ld: None, f, sizes), dtype=np.int64)) % f.p
    keep = m_ok[:, None] & n_ok[None, :]
    coords = {"g": np.int64(g), "m": np.broadcast_to(ms[:, None], acc.shape)[keep],
              "n": np.broadcast_to(ns[None, :], acc.shape)[keep]}
    write(name, lw.out, coords, acc[keep], sizes, mem, lw.index_width, True, None, where)


def run_grouped_wgrad(name: str, lw: GroupedWgradLowering, sizes: Mapping[str, int], mem: Memory, blocks,
                      keep: np.ndarray | None = None) -> None:
    """Run the blocks `blocks`, (block x, group) pairs, adding into O's prior contents."""
    if lw.loop is None:
        mem.fault(f"{name}: the grouped weight gradient has no stage maps for this tile")
        return
    for fault in loop_faults(lw.loop) + index_faults(lw) + walk_faults(lw, sizes):
        mem.fault(f"{name}: {fault}")
    route = wgmma_route(lw.loop.operands)
    for fault in route.faults:
        mem.fault(f"{name}: {fault}")
    target = lw.out.tensor
    if target not in mem.written:  # O += …: the kernel adds into what O holds (an input of the model)
        mem.written[target] = WrittenTensor(target, int(lw.out.numel(sizes)), mem.field.p, True, mem.inputs.get(target))
    offs = group_offsets(lw, sizes, mem)  # type: ignore[arg-type]
    n_tiles = int(lw.n_tiles(sizes))
    gx = int(lw.grid(sizes)[0])
    tiles = sorted(tuple(int(t) for t in lw.block_tile(bx, n_tiles)) for bx in range(gx))
    if tiles != [(mt, nt) for mt in range(gx // n_tiles) for nt in range(n_tiles)]:
        mem.fault(f"{name}: the blocks of a group (`block_tile` over grid.x = {gx}) do not take its output tiles once "
                  "each")
    if _rows_leave_tile(lw):  # an accumulator outside the tile: its blocks are not run (the fault names it)
        return
    for bx, g in blocks:
        mt, nt = (int(x) for x in lw.block_tile(bx, n_tiles))
        _block(name, lw, sizes, mem, offs, route, int(g), mt, nt)


def _blocks_of(lw: GroupedWgradLowering, sizes: Mapping[str, int], tms, tns) -> list[tuple[int, int]]:
    n_tiles = int(lw.n_tiles(sizes))
    return [(mt * n_tiles + nt, g) for g in range(sizes[lw.g]) for mt in tms for nt in tns]


def _span(tiles, tile: int, size: int) -> np.ndarray:
    return np.unique(np.concatenate([np.arange(t * tile, min((t + 1) * tile, size)) for t in tiles]))


def _sampled(lw: GroupedWgradLowering, sizes: Mapping[str, int]) -> tuple[object, tuple[np.ndarray, ...], str]:
    """The first, second and last tile of #M and of #N (`sample_tiles`: the classes the witness keeps), in every
    group (each group's rows are its own), and the output elements they cover."""
    k = lw.kernel
    tms = sample_tiles(-(-sizes[lw.m] // k.bm))
    tns = sample_tiles(int(lw.n_tiles(sizes)))
    box = (np.arange(sizes[lw.g]), _span(tms, k.bm, sizes[lw.m]), _span(tns, k.bn, sizes[lw.n]))
    return _blocks_of(lw, sizes, tms, tns), box, f"tiles m {tms} × n {tns} of every group"


def _box(lw: GroupedWgradLowering, box: tuple[np.ndarray, ...], sizes: Mapping[str, int]) -> tuple[object, object, str]:
    """The blocks whose tiles hold a demanded box of O (every element of each, so no lane to drop)."""
    k = lw.kernel
    tms = sorted({int(m) // k.bm for m in np.asarray(box[1]).ravel()})
    tns = sorted({int(n) // k.bn for n in np.asarray(box[2]).ravel()})
    return _blocks_of(lw, sizes, tms, tns), None, f"tiles m {tms} × n {tns} of every group"


def _tiled_axes(name: str, lw: GroupedWgradLowering) -> list[TileAxis]:
    """The output's m and n tiles. Not the rows: a group's k tiles depend on the drawn grouping (groups longer
    than a tile, empty ones and one holding every row are tests/prove/test_grouped_wgrad.py's)."""
    k = lw.kernel
    return [TileAxis(name, "m", lw.m, k.bm), TileAxis(name, "n", lw.n, k.bn)]


register_kind(GroupedWgradLowering, KindProof(run=run_grouped_wgrad, final_selection=_sampled,
                                              box_selection=_box, tiled_axes=_tiled_axes))

__all__ = ["loop_faults", "run_grouped_wgrad"]
