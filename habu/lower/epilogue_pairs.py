"""The epilogue's own loads read as pairs, as data.

A wgmma consumer thread holds its accumulators in column pairs (m, n), (m, n + 1) (`AccumulatorFragment`: n even),
and its TMA-store epilogue computes both elements of a pair together. A load the epilogue reads at both elements of
every pair, from a tensor whose element (…, n + 1) follows (…, n) in memory, is one load of both: 4 bytes of two
16-bit elements, 8 of two f32. The 4096-token FFN backward's dX product (dX = dT6 + dT2·W1ᵀ, which reads dT6 in
its epilogue) took 654 µs with two 2-byte loads a pair and 640 with one 4-byte load (H100, session 61,
docs/PERF.md); a load that checked the address's alignment at run time, falling back to two, gained nothing.

So the one load needs the pair aligned wherever it is read, and inside the tensor wherever its first element is:
the tensor's last dimension (n's) has a static, even length, as has every bound on n, so every row starts at an
even element and a pair is inside exactly where its first element is; the launch checks the base address's
alignment (`ContractionLowering.vector_accesses`). The load is `habu::load_pair16` / `load_pair32`
(include/habu/memory/global.cuh): one load under the first element's mask, the second element kept under its own.
The value of element q is the element at the pair's first offset plus q: the finite-field check reads it there
(habu/prove/interp.py), and the `epilogue-load-pairs` rule checks the contiguity and the even lengths for every
size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from habu.lower.access import Access, VectorAccess

PAIR_DTYPES = ("bf16", "f16", "f32")


def pairable(access: Access, sizes: Mapping[str, int | None]) -> bool:
    """Whether an epilogue load may be read as pairs along n wherever the plan puts it: a pair type, contiguous
    along n, its last dimension and every bound on n of a static even length (`sizes`: the model's, None for a
    runtime extent), the other positions' strides multiples of that length (a row-major tensor's)."""
    static = {name: size for name, size in sizes.items() if size is not None}
    last = len(access.positions) - 1
    even = access.extents[-1]
    return (access.dtype in PAIR_DTYPES and contiguous_along(access, "n") and static.get(even, 1) % 2 == 0
            and all(even in access.strides[i] for i in range(last))
            and all(static.get(b.extent, 1) % 2 == 0 for b in access.masks if b.axis == "n"))


def contiguous_along(access: Access, axis: str) -> bool:
    """Whether the access's element at axis + 1 is the one after its element at axis in memory: the axis feeds
    exactly one position, the last, with stride 1, and no gather reads its index table there."""
    feeds = [i for i, p in enumerate(access.positions) if p.kind != "const" and p.axis == axis]
    last = len(access.positions) - 1
    return (feeds == [last] and access.positions[last].kind == "axis" and access.strides[last] == ()
            and not access.checks)


def paired_loads(lw: Any) -> tuple[int, ...]:
    """The indices into `lw.epi_loads` the epilogue reads as pairs along n: the wgmma TMA-store epilogue of
    unsplit, unswapped tiles (its pairs run along n), each load the lowering found `pairable` (`epi_pairable`)."""
    k = lw.kernel
    if (k.mma != "wgmma" or k.store != "tma" or lw.tma_store is None or lw.split_mode != "none" or k.swap_ab
            or lw.reduction is not None):
        return ()
    return tuple(lw.epi_pairable)


def pair_vector_accesses(lw: Any) -> list[VectorAccess]:
    """The launch's alignment check of each tensor the epilogue reads as pairs (2 elements: 4 or 8 bytes)."""
    return [VectorAccess(lw.epi_loads[i][1].tensor, 2, f"the epilogue reads pairs of adjacent "
                         f"{lw.epi_loads[i][1].tensor} elements as one vector") for i in paired_loads(lw)]


def pair_first(n: Any, pair: int) -> Any:
    """The first column of the pair that holds column n: pairs start at even columns (a tile's n0 is a multiple
    of its width, the fragment's columns `pair · (lane % 4) + 8 · j`)."""
    return n - n % pair


__all__ = ["PAIR_DTYPES", "contiguous_along", "pair_first", "pair_vector_accesses", "pairable", "paired_loads"]
