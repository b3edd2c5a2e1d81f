"""The TMA-store epilogue of the wgmma path, as data: where each consumer warpgroup stages its output
boxes in shared memory and where TMA stores them.

Per 64-row slab s of consumer warpgroup cw and per box b of `box.row_elems` columns (one 128-byte
swizzle span), the warpgroup's threads write their accumulator pairs (j = b·groups + jj, the fragment
map `habu.lower.fragments`) into a buffer at the box tile's byte offset of (row, column in the box),
then one thread stores the box with TMA at (m0 + slab_row(cw, s), n0 + b·box columns). A warpgroup
takes its `buffers` (two) buffers in turn and, before filling one, waits until at most buffers - 1 of
its stores still read (`bulk_wait_group_read`): the store of one box may still read its buffer while
the threads fill the other.

    buffer(cw, stored) = base + cw·warpgroup_stride + (stored mod buffers)·buffer_stride   (bytes from smem_base)

The emitter prints every one of these numbers from here; the finite-field check runs the same map
(`habu.prove.tma_store`): it writes each accumulator element's identity where the epilogue puts it,
reads each box back as TMA's swizzle places it (the PTX/driver definition, trusted) and requires every
output element of the tile to arrive at its own place, once, with the buffers inside the epilogue's
part of shared memory and apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from habu.lower.layouts import SmemTile
from habu.lower.registers import consumer_warpgroups
from habu.lower.smem import tensor_core_smem
from habu.plan.plan import ContractionKernel
from habu.spec.dtypes import DTYPES

SLAB_ROWS = 64  # rows of one wgmma m64 slab, and of one TMA-store box


@dataclass(frozen=True)
class TmaStoreEpilogue:
    box: SmemTile  # one staged box: SLAB_ROWS rows of box.row_elems output elements, swizzled
    boxes: int  # boxes per slab (BN / box columns)
    groups: int  # 8-column accumulator groups per box (the fragment's j within a box)
    slabs: int  # 64-row slabs per consumer warpgroup
    consumers: int
    base: int  # bytes from smem_base to consumer 0's first buffer
    buffer_stride: int  # bytes from a warpgroup's first buffer to its second
    warpgroup_stride: int  # bytes from one consumer's buffers to the next one's
    region: tuple[int, int]  # [start, end) bytes of shared memory the layout gives the epilogue's buffers
    buffers: int = 2  # buffers per warpgroup, used in turn; a box waits until at most buffers - 1 stores still read
    # outputs staged per box, each in a buffer of its own (the chain's extra outputs first, `extra_outs`, then
    # its end): a box's round fills `outputs` buffers, and `rounds` = buffers / outputs rounds take them in turn
    outputs: int = 1

    @property
    def box_cols(self) -> int:
        return self.box.row_elems

    @property
    def rounds(self) -> int:
        """Rounds of boxes whose buffers a warpgroup takes in turn: a round waits until at most rounds - 1
        rounds' stores still read."""
        return self.buffers // self.outputs

    def buffer(self, cw: Any, stored: Any, output: Any = 0) -> Any:
        """Bytes from smem_base to the buffer warpgroup cw fills for output `output` of its box round `stored`."""
        turn = stored % self.rounds if self.rounds > 1 else 0  # one round: the same buffers every box
        return self.base + cw * self.warpgroup_stride + (turn * self.outputs + output) * self.buffer_stride

    def column_group(self, b: Any, jj: Any) -> Any:
        """The accumulator's 8-column group j of group jj of box b."""
        return b * self.groups + jj

    def slab_row(self, cw: Any, s: Any) -> Any:
        return (cw * self.slabs + s) * self.box.rows

    def staging_byte(self, row: Any, col: Any) -> Any:
        """Where in its buffer the element at (row, column within the box) is staged."""
        return self.box.byte_offset(row, col)


def tma_store_for(kernel: ContractionKernel, a_dtype: str, b_dtype: str, out_dtype: str,
                  b_kmajor: bool, outputs: int = 1) -> TmaStoreEpilogue | None:
    """The TMA-store epilogue of a wgmma kernel that stores through TMA (None otherwise, or where its
    buffers are not evenly spaced: the emitter refuses such a layout), staging `outputs` outputs a box
    (at most its buffers: `staged_outputs`)."""
    if kernel.mma != "wgmma" or kernel.store != "tma":
        return None
    key = (kernel.warps, kernel.warp_specialized, kernel.stages, kernel.tile_m, kernel.tile_n, kernel.tile_k,
           kernel.swizzle, kernel.a_move, kernel.b_move, kernel.mma, kernel.store, a_dtype, b_dtype, out_dtype,
           b_kmajor, outputs)
    if key not in _CACHE:
        built = _build(kernel, a_dtype, b_dtype, out_dtype, b_kmajor)
        _CACHE[key] = None if built is None else replace(built, outputs=outputs)
    return _CACHE[key]


def staged_outputs(extras: int, buffers: int = 2) -> int:
    """Outputs the TMA-store epilogue stages a box: the chain's end and its extra outputs where a round's
    buffers hold them all (the forward that saves S1 beside GELU(S1 + B1): two, each box's round taking
    both buffers), else the end alone (the extras then leave directly from the registers)."""
    return 1 + extras if 1 + extras <= buffers else 1


def _build(kernel: ContractionKernel, a_dtype: str, b_dtype: str, out_dtype: str,
           b_kmajor: bool) -> TmaStoreEpilogue | None:
    consumers = consumer_warpgroups(kernel.warps, kernel.warp_specialized)
    e = DTYPES[out_dtype].bytes
    width = 128 // e
    if consumers < 1 or kernel.tile_m % (SLAB_ROWS * consumers) or kernel.tile_n % width:
        return None
    off = {b.name: b for b in tensor_core_smem(kernel, a_dtype, b_dtype, b_kmajor).buffers}
    base = off["E0.0"].offset
    other = off["E0.1"].offset - base
    per_wg = off["E1.0"].offset - base if consumers > 1 else 0
    if any(off[f"E{c}.{j}"].offset != base + c * per_wg + j * other for c in range(consumers) for j in (0, 1)):
        return None
    ends = [off[f"E{c}.{j}"] for c in range(consumers) for j in (0, 1)]
    region = (min(b.offset for b in ends), max(b.offset + b.size for b in ends))
    return TmaStoreEpilogue(SmemTile(SLAB_ROWS, width, e, 128), kernel.tile_n // width, width // 8,
                            kernel.tile_m // (SLAB_ROWS * consumers), consumers, base, other, per_wg, region)


_CACHE: dict[tuple, TmaStoreEpilogue | None] = {}

__all__ = ["SLAB_ROWS", "TmaStoreEpilogue", "staged_outputs", "tma_store_for"]
