"""Executing the wgmma TMA-store epilogue (`habu.lower.tma_store`): which output element of the tile each
TMA store writes, and from which accumulator element.

Like the shared-memory operand route (`habu.prove.smem_route`), the map does not depend on the data or
on the tile's position, so it is run once per lowering on element identities: every thread of every
consumer warpgroup writes, per slab and box, the identity of the tile element its register pair holds
(`AccumulatorFragment.element`: the fragment map the epilogue prints, itself checked against the PTX
ISA by `fragment_mismatch`) at the staging byte the lowering gives, in the buffer it names; TMA then
reads the box back as the driver's swizzle places it (`tma_box_bytes`, trusted) and stores it at the
box's origin. Every element of the BM x BN tile must arrive at its own place exactly once. Faults: a
staging write outside its box or not aligned to its pair, two writes to one element, a box element no
thread staged, an element stored at another's place or never stored, a buffer outside the epilogue's
part of shared memory or not aligned to the swizzle's period, and two buffers that may be in use at
once (a warpgroup's consecutive boxes: the store of one may still read its buffer while the threads
fill the next; any two warpgroups' boxes) overlapping.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from habu.lower.fragments import AccumulatorFragment
from habu.lower.tma_store import TmaStoreEpilogue
from habu.prove.fragments import tma_box_bytes


@lru_cache(maxsize=256)
def tma_store_faults(st: TmaStoreEpilogue, frag: AccumulatorFragment, bm: int, bn: int) -> tuple[str, ...]:
    """The faults of one output tile's TMA-store epilogue (at most four), () when every element of the
    tile is stored at its place."""
    faults: list[str] = []
    box, e = st.box, st.box.elem_bytes
    faults += _buffer_faults(st)
    warp, lane, jj, h = (x.ravel() for x in np.meshgrid(np.arange(4), np.arange(32), np.arange(st.groups),
                                                         np.arange(frag.halves), indexing="ij"))
    tma_read = tma_box_bytes(box.rows, st.box_cols, e, box.swizzle)  # [rows, cols] bytes
    stored = np.zeros((bm, bn), dtype=np.int64)
    for cw in range(st.consumers):
        for s in range(st.slabs):
            for b in range(st.boxes):
                j = st.column_group(b, jj)
                row, col = frag.element(warp, lane, j, h, 0)  # the pair (row, col), (row, col + 1)
                tile_row = st.slab_row(cw, s) + row
                col_in_box = frag.element(warp, lane, jj, h, 0)[1]  # the staging byte's column: group jj
                start = np.asarray(st.staging_byte(row, col_in_box), dtype=np.int64)
                staged = np.full(box.bytes // e, -1, dtype=np.int64)
                width = frag.pair * e
                bad = (start < 0) | (start + width > box.bytes) | (start % width != 0)
                if bad.any():
                    i = int(np.nonzero(bad)[0][0])
                    faults.append(f"consumer {cw}'s epilogue stages tile[{int(tile_row[i])}, {int(col[i])}] at byte "
                                  f"{int(start[i])} of its {box.bytes}-byte box buffer (outside it, or not "
                                  f"{width}-byte aligned)")
                slots = (start[~bad, None] // e + np.arange(frag.pair)[None, :]).ravel()
                ids = (tile_row[~bad, None] * bn + col[~bad, None] + np.arange(frag.pair)[None, :]).ravel()
                counts = np.bincount(slots, minlength=len(staged))
                if (counts > 1).any():
                    slot = int(np.nonzero(counts > 1)[0][0])
                    faults.append(f"two of consumer {cw}'s threads stage tile elements at byte {slot * e} of box {b} "
                                  f"(slab {s})")
                staged[slots] = ids
                # TMA reads the box and stores element (r, c) at the box's origin + (r, c)
                got = staged[tma_read // e]
                r0, c0 = st.slab_row(cw, s), b * st.box_cols
                r = r0 + np.arange(box.rows)[:, None]
                c = c0 + np.arange(st.box_cols)[None, :]
                inside = (r < bm) & (c < bn)
                want = r * bn + c
                wrong = inside & (got != want)
                if wrong.any():
                    i, k = (int(x[0]) for x in np.nonzero(wrong))
                    what = ("a buffer element no thread staged" if got[i, k] < 0 else
                            f"tile[{int(got[i, k]) // bn}, {int(got[i, k]) % bn}]'s value")
                    faults.append(f"consumer {cw}'s TMA store of box {b} (slab {s}) writes tile[{int(r[i, 0])}, "
                                  f"{int(c[0, k])}] of the output tile with {what}")
                if (~inside).any():
                    faults.append(f"consumer {cw}'s TMA store of box {b} (slab {s}) reaches past the block's "
                                  f"{bm} x {bn} output tile (another block's output)")
                rr, cc = np.broadcast_arrays(r, c)
                np.add.at(stored, (rr[inside], cc[inside]), 1)
    if (stored != 1).any():
        i, k = (int(x[0]) for x in np.nonzero(stored != 1))
        faults.append(f"the TMA-store epilogue stores tile[{i}, {k}] of the output tile {int(stored[i, k])} times")
    return tuple(dict.fromkeys(faults))[:4]


def _buffer_faults(st: TmaStoreEpilogue) -> list[str]:
    faults: list[str] = []
    period = st.box.swizzle * 8 if st.box.swizzle else 16
    size = st.box.bytes
    live: list[tuple[str, int]] = []  # buffers that may be in use at once: every warpgroup's two
    for cw in range(st.consumers):
        # consecutive rounds: the earlier rounds' stores may read while the last is filled; each round's outputs
        # (the chain's extra outputs beside its end) are filled and stored together
        for stored in range(st.rounds):
            for o in range(st.outputs):
                buf = int(st.buffer(cw, stored, o))
                s, b = divmod(stored, st.boxes)
                what = f"output {o}'s " if st.outputs > 1 else ""
                where = (f"{'' if s < st.slabs else 'the next tile, '}tile[{st.slab_row(cw, s % st.slabs)}, "
                         f"{b * st.box_cols}] onwards")
                live.append((f"consumer {cw}'s {what}box {stored} ({where})", buf))
                if buf < st.region[0] or buf + size > st.region[1] or buf % period:
                    faults.append(f"consumer {cw}'s {what}box buffer {stored} ({where}) lies at bytes {buf}..{buf + size - 1}"
                                  f" of shared memory, outside the epilogue's {st.region[0]}..{st.region[1] - 1} or not "
                                  f"{period}-byte aligned")
    if st.rounds < 1:
        faults.append(f"a box's round stages {st.outputs} outputs in {st.buffers} buffers")
    for i, (name, a) in enumerate(live):
        for other, b in live[i + 1:]:
            if a < b + size and b < a + size:
                faults.append(f"{other} is staged over {name} (bytes {max(a, b)}..{min(a, b) + size - 1} of shared "
                              "memory), whose TMA store may still read it")
    return faults


def tma_store_key(lw) -> str:
    """What the finite-field check's result depends on through the TMA-store epilogue: nothing when it
    stores every element at its place (plans differing only in the store share one check)."""
    st = lw.tma_store
    if st is None or not tma_store_faults(st, lw.fragment, lw.bm, lw.bn):
        return "plain"
    return repr(st)


__all__ = ["tma_store_faults", "tma_store_key"]
