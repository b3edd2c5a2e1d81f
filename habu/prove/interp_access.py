"""The loads and stores of a lowered kernel over GF(p) (habu/prove/interp.py runs the kernels): each access's
offsets from the lowering's strides in the plan's index width (int32 wraps as on the GPU), its masks, and the
memory it reads or writes; an element read as part of a pair or a vector is read as the kernel reads it, at the
first element's offset plus its place, under the first element's mask."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from habu.lower.access import Access
from habu.lower.epilogue_pairs import pair_first
from habu.prove.index_arith import NumpyIndex, computing
from habu.prove.virtual import WrittenTensor

if TYPE_CHECKING:
    from habu.prove.interp import Memory


def element_at(access: Access, offset: int, sizes: Mapping[str, int]) -> str:
    """The element `T[i, j, ...]` at a flat `offset` of the access's tensor (row-major over its extents)."""
    from habu.lower.access import size_of

    dims = [size_of(e, sizes) for e in access.extents]
    out = []
    for d in reversed(dims):
        out.append(offset % d if d else 0)
        offset //= d if d else 1
    return f"{access.tensor}[{', '.join(str(x) for x in reversed(out))}]"


Where = "Callable[[np.ndarray], str] | None"


def _offsets(kernel: str, access: Access, coords: Mapping[str, np.ndarray], sizes: Mapping[str, int],
             mem: Memory, width: int, what: str, where=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, mask, out-of-bounds lanes) of an access at the given axis coordinates, as the kernel
    computes them: the lowering's `Access.mask` and `Access.offset`, run on wrapping integer arrays."""
    arrays = [np.asarray(coords[b.axis]) for b in access.masks] + \
             [np.asarray(coords[p.axis]) for p in access.positions if p.kind != "const"]
    shape = np.broadcast_shapes(*(a.shape for a in arrays)) if arrays else ()
    mask = np.broadcast_to(access.mask(coords, sizes, NumpyIndex(width, mem, kernel)), shape)
    arith = NumpyIndex(width, mem, kernel, mask, where)
    offset = np.broadcast_to(access.offset(coords, sizes, arith), shape).astype(np.int64)
    numel = access.numel(sizes)
    bad = mask & ((offset < 0) | (offset >= numel))
    if np.any(bad):
        o = int(offset[bad].flat[0])
        mem.fault(f"{computing(where, bad)}{kernel} {what} {access.tensor} out of bounds: offset {o} is "
                  f"outside 0..{numel - 1}")
    return offset, mask, bad


def read(kernel: str, access: Access, coords: Mapping[str, np.ndarray], sizes: Mapping[str, int],
         mem: Memory, width: int, where=None) -> np.ndarray:
    offsets, mask, bad = _offsets(kernel, access, coords, sizes, mem, width, "reads", where)
    return mem.value(kernel, access, offsets, mask, bad)


def read_pair(kernel: str, access: Access, coords: Mapping[str, np.ndarray], pair: int, sizes: Mapping[str, int],
              mem: Memory, width: int, where=None) -> np.ndarray:
    """An epilogue load read as pairs along n (habu/lower/epilogue_pairs.py), as the kernel reads it: element q of
    a pair at the pair's first offset plus q, under the element's own mask."""
    first = pair_first(np.asarray(coords["n"]), pair)
    return _from_first(kernel, access, coords, "n", first, False, sizes, mem, width, where, "a pair's second element")


def read_vector(kernel: str, access: Access, coords: Mapping[str, np.ndarray], along: str, first: np.ndarray,
                sizes: Mapping[str, int], mem: Memory, width: int, where=None) -> np.ndarray:
    """A main loop's vector loads (cp.async, ldg) as the kernel makes them: element q of a vector along `along` (the
    access's contiguous axis) at the vector's first element's offset plus q, under the first element's mask (a
    vector past the access's bound reads what memory holds there: a staged buffer's zero padding)."""
    return _from_first(kernel, access, coords, along, first, True, sizes, mem, width, where, "inside a vector")


def _from_first(kernel: str, access: Access, coords: Mapping[str, np.ndarray], along: str, first: np.ndarray,
                first_mask: bool, sizes: Mapping[str, int], mem: Memory, width: int, where, what: str) -> np.ndarray:
    """Elements read at their group's first element's offset plus their place along `along`, under the first
    element's mask (`first_mask`) or their own."""
    at = np.asarray(coords[along])
    start, mask, _ = _offsets(kernel, access, {**coords, along: first}, sizes, mem, width, "reads", where)
    if not first_mask:
        _, mask, _ = _offsets(kernel, access, coords, sizes, mem, width, "reads", where)
    offsets = start + np.broadcast_to(at - first, start.shape)
    bad = mask & ((offsets < 0) | (offsets >= access.numel(sizes)))
    if np.any(bad):
        mem.fault(f"{computing(where, bad)}{kernel} reads {access.tensor} out of bounds: offset "
                  f"{int(offsets[bad].flat[0])} ({what}) is outside 0..{access.numel(sizes) - 1}")
    return mem.value(kernel, access, offsets, mask, bad)


def write(kernel: str, access: Access, coords: Mapping[str, np.ndarray], values: np.ndarray,
          sizes: Mapping[str, int], mem: Memory, width: int, accumulate: bool | str,
          owned: np.ndarray | None = None, where=None) -> None:
    offsets, mask, bad = _offsets(kernel, access, coords, sizes, mem, width, "writes", where)
    mask = mask & ~bad  # a store outside the tensor never lands in it
    # the lanes: the coordinates' shape, or the values' where the access reads no coordinate (a scalar
    # output stored by each of the lanes that computed it)
    shape = np.broadcast_shapes(mask.shape, np.shape(values), np.shape(owned) if owned is not None else ())
    mask, offsets = np.broadcast_to(mask, shape), np.broadcast_to(offsets, shape)
    values = np.broadcast_to(values, shape)
    numel = int(access.numel(sizes))
    if access.tensor not in mem.written:
        mem.written[access.tensor] = WrittenTensor(access.tensor, numel, mem.field.p, accumulate)
    elif mem.written[access.tensor].numel != numel:  # one buffer, two layouts: the runtime allocates one of them
        mem.fault(f"{kernel} writes {access.tensor} as {numel} elements over ({', '.join(access.extents)}), where an "
                  f"earlier kernel wrote it as {mem.written[access.tensor].numel}: one buffer in two layouts")
        mask = mask & (offsets < mem.written[access.tensor].numel)
    if owned is not None:
        # the element each lane writes must be the one its coordinates name (no overrun into a neighbour)
        true_off = np.zeros(mask.shape, dtype=np.int64)
        for pos, p in enumerate(access.positions):
            v = np.int64(p.value) if p.kind == "const" else np.asarray(coords[p.axis], dtype=np.int64)
            true_off = true_off + v * np.int64(access.stride(pos, sizes))
        strays = mask & ((offsets != true_off) | ~np.broadcast_to(owned, mask.shape))
        if np.any(strays):
            o = int(offsets[strays].flat[0])
            mem.fault(f"{computing(where, strays)}{kernel} writes {element_at(access, o, sizes)}, outside the "
                      "elements its block computes (a store past the tile's edge or through a wrong stride)")
    mem.written[access.tensor].write(offsets[mask], values[mask])


# ----------------------------------------------------------------------------- pointwise expressions


__all__ = ["element_at", "read", "read_pair", "read_vector", "write"]
