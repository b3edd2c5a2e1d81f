"""`int32-offsets` over shared memory: the byte offsets and slots the newer paths form in shared
memory, evaluated from the lowering's own maps (what the emitter prints), stay within what the block
allocates, and so within 32 bits.

- a wgmma kernel (plain, batched, n-contiguous B): every stage tile `WgmmaOperands.stage_tile(side, s)`
  ends before the layout's epilogue buffers and barriers begin (the stage tiles' overlap with each other
  is the finite-field check's, habu.prove.smem_route), and the TMA-store epilogue's last buffer
  `TmaStoreEpilogue.buffer` ends before the barriers, and the ring's barriers
  (`MbarrierRing.base`, `empty_barrier`) come after both, 8-byte aligned, within the layout;
- a column kernel: the largest partial slot a thread writes (`partial_slot` at the last row group,
  column thread and vector element) and the largest slot the combine reads (`combined_slot`) are below
  the block's `slots` floats of partials;
(A grouped GEMM's 32-bit shared values, its tile starts `starts[g]`, are at most grid.x, which
`grid-dims` bounds by 2^31 − 1; its row offsets `offs[g]` are the index tensor's, range-checked.)

Every offset grows with its indices (nonnegative strides), so the values at the last indices are the
largest. Today the shared-memory budget bounds all of them far below 2^31 (a block has at most 228 KiB);
these obligations tie the offsets the kernel computes to that allocation, so a lowering whose maps
outgrow it (a stride, a stage count, a buffer moved) is refused by the rules, naming the offset.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from habu.lower import ColumnLowering, ContractionLowering
from habu.lower.layouts import WgmmaOperands
from habu.lower.pipeline import MbarrierRing
from habu.lower.support import lowering_smem
from habu.prove.obligation import INT31, INT32_OFFSETS, Obligation


def _within(name: str, what: str, largest: Any, limit: Any, where: str) -> Obligation:
    return Obligation(INT32_OFFSETS, name, None, f"32-bit shared-memory {what}: {largest} ≤ {limit} ({where})",
                      bool(largest <= limit and largest <= INT31),
                      detail=f"{what} reaches {largest}, past {limit} ({where}): it lands in another buffer or past "
                             "the block's shared memory")


def contraction_smem_obligations(name: str, lw: ContractionLowering) -> Iterator[Obligation]:
    """A wgmma kernel's stage tiles and TMA-store buffers, from its operands and epilogue."""
    ops = lw.operands
    if not isinstance(ops, WgmmaOperands):
        return
    layout = lowering_smem(lw)
    end = max(b.offset + b.size for b in layout.buffers)
    stages_end = min((b.offset for b in layout.buffers if b.name[0] not in "AB"), default=end)
    last = max(int(ops.stage_tile(side, s)) + tile.bytes
               for s in range(ops.stages) for side, tile in (("A", ops.a_tile), ("B", ops.b_tile)))
    yield _within(name, f"byte offset of the stage tiles' end (the last of {ops.stages} stages, "
                        f"{ops.stage_stride} bytes apart)", last, stages_end,
                  "where the layout's epilogue buffers and barriers begin")
    st = lw.tma_store
    ring = lw.pipeline
    bars = ring.base if isinstance(ring, MbarrierRing) else end
    if st is not None:
        buffer = int(st.buffer(st.consumers - 1, st.buffers - 1)) + st.box.bytes
        yield _within(name, "byte offset of the TMA-store buffers' end (the last consumer's last buffer)",
                      buffer, bars, "where the ring's barriers begin")
    if isinstance(ring, MbarrierRing):
        # the ring's barriers (8-byte mbarriers, from `bars` = its base): after every tile and buffer
        # before them, within the layout
        before = max([last] + ([int(st.buffer(st.consumers - 1, st.buffers - 1)) + st.box.bytes] if st else []))
        after = int(ring.empty_barrier(ring.base, ring.stages - 1)) + 8
        yield Obligation(INT32_OFFSETS, name, None,
                         f"32-bit shared-memory barriers at bytes {ring.base}..{after - 1}: 8-byte aligned, after the "
                         f"tiles and buffers (which end at {before}), within the layout's {end} bytes",
                         ring.base % 8 == 0 and before <= ring.base and after <= end <= INT31,
                         detail=f"the ring's barriers at bytes {ring.base}..{after - 1} overlap a tile or buffer "
                                f"(they end at {before}), pass the layout's {end} bytes or are misaligned")


def column_smem_obligations(name: str, lw: ColumnLowering) -> Iterator[Obligation]:
    """A column kernel's shared-memory partial slots (`ColumnLowering`), written and combined."""
    tm = lw.thread_map
    written = lw.partial_slot(tm.row_groups - 1, tm.column_threads - 1, tm.vector - 1)
    read = lw.combined_slot(tm.row_groups - 1, tm.tile_columns - 1)
    limit = lw.partials - 1
    yield _within(name, "partial slot a thread writes (its last row group, column thread and vector element)",
                  written, limit, f"the last of the block's {lw.partials} partials")
    yield _within(name, "partial slot the combine reads (the last row group's last column)", read, limit,
                  f"the last of the block's {lw.partials} partials")

