"""The finite-field check of a staging pass (habu/lower/staging.py), run block by block as the kernel runs: each
block's origin, the element each thread moves and, in a tile pass, the shared tile's slots are the lowering's own
maps, so a pass that copies an element to the wrong place, or stores a slot no thread loaded, leaves a wrong or
unwritten element in the buffer the product then reads."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Set
from typing import TYPE_CHECKING

import numpy as np

from habu.lower.staging import StageLowering
from habu.prove.index_arith import NumpyIndex
from habu.prove.interp_access import read, write

if TYPE_CHECKING:
    from habu.prove.interp import Memory


def stage_blocks(stage: StageLowering, sizes: Mapping[str, int], rows: np.ndarray,
                 wanted: Set[tuple[int, ...]]) -> np.ndarray:
    """The pass's blocks (bx, by, bz) that copy the given rows of the wanted batches (batch coordinates in the
    order of `stage.batch`; `()` unbatched): every block along k."""
    along_k, _ = stage.grid(sizes)
    ys = np.unique(np.asarray(rows, dtype=np.int64) // stage.step_rows)
    spans = [stage.tile.across if stage.tile and a == stage.tile.axis else 1 for a, _e in stage.batch]
    zs = []
    for z in range(int(stage.batches(sizes))):
        first = stage.batch_coordinates(np.int64(z), sizes)
        lo = [int(first[a]) for a, _e in stage.batch]
        if any(all(lo[i] <= w[i] < lo[i] + spans[i] for i in range(len(w))) for w in wanted):
            zs.append(z)
    return np.array(list(itertools.product(range(int(along_k)), ys.tolist(), zs)), dtype=np.int64).reshape(-1, 3)


def run_stage(name: str, stage: StageLowering, sizes: Mapping[str, int], mem: Memory, width: int,
              blocks: np.ndarray) -> None:
    """Run the pass's `blocks` ((bx, by, bz) rows): every thread's elements, loads then stores, as the kernel
    does (a padding element, k ≥ #K, is read as the source's masked 0)."""
    if len(blocks) == 0:
        return
    bx, by, bz = (blocks[:, i][:, None] for i in range(3))
    origin = stage.origin(bx, by, bz, sizes)
    if stage.tile is None:  # thread t copies the element at k0 + t
        at = stage.element(origin, 0, np.arange(stage.threads, dtype=np.int64)[None, :])
        _store(name, stage, sizes, mem, width, at, read(name, stage.src, at, sizes, mem, width, _copying(stage, at)))
        return
    tile = stage.tile
    # every thread's elements at every step, as the kernel's loops take them (`StageTile.element_index`)
    steps, threads = np.meshgrid(np.arange(tile.steps(stage.threads)), np.arange(stage.threads), indexing="ij")
    e = tile.element_index(steps, threads, stage.threads).astype(np.int64).reshape(1, -1)
    c, kk = tile.load_lane(e)
    at = stage.element(origin, c, kk)
    values = read(name, stage.src, at, sizes, mem, width, _copying(stage, at))
    loaded = np.broadcast_to(stage.dst.mask(at, sizes, NumpyIndex(width, mem, name)), values.shape)  # the kernel loads what it will store
    shared = np.zeros((len(blocks), tile.slots), dtype=np.int64)
    held = np.zeros((len(blocks), tile.slots), dtype=bool)
    block = np.broadcast_to(np.arange(len(blocks))[:, None], values.shape)
    slot = np.broadcast_to(tile.slot(c, kk), values.shape)
    shared[block[loaded], slot[loaded]] = values[loaded]
    held[block[loaded], slot[loaded]] = True
    c, kk = tile.store_lane(e)
    at = stage.element(origin, c, kk)
    slot = np.broadcast_to(tile.slot(c, kk), values.shape)
    stored = np.broadcast_to(stage.dst.mask(at, sizes, NumpyIndex(width, mem, name)), values.shape)
    unloaded = stored & ~held[block, slot]
    if np.any(unloaded):
        b, j = (int(x[0]) for x in np.nonzero(unloaded))
        mem.fault(f"{name}: block {tuple(int(v) for v in blocks[b])} stores shared slot {int(slot[b, j])}, which no "
                  "thread of it loaded")
    out = np.where(unloaded, mem.poison(slot + 7919 * block), shared[block, slot])
    _store(name, stage, sizes, mem, width, at, out)


def _store(name: str, stage: StageLowering, sizes: Mapping[str, int], mem: Memory, width: int,
           at: Mapping[str, np.ndarray], values: np.ndarray) -> None:
    write(name, stage.dst, at, values, sizes, mem, width, False, np.ones(np.shape(values), dtype=bool),
          _copying(stage, at))


def _copying(stage: StageLowering, at: Mapping[str, np.ndarray]):
    """A fault's namer: the source element the first faulty lane copies (`computing`'s `where`)."""
    def name(bad: np.ndarray) -> str:
        lane = tuple(int(i[0]) for i in np.nonzero(bad))
        coords = [str(p.value) if p.kind == "const" else
                  f"{p.table}[{int(np.broadcast_to(at[p.axis], bad.shape)[lane])}]" if p.kind == "gather" else
                  str(int(np.broadcast_to(at[p.axis], bad.shape)[lane])) for p in stage.src.positions]
        return f"the copy of {stage.src.tensor}[{', '.join(coords)}]"
    return name


__all__ = ["run_stage", "stage_blocks"]
