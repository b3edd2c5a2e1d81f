"""Random inputs that are never materialised, and the memory kernels write into.

A virtual tensor's element at flat offset o is H(key, o) mod p, where H is splitmix64 and the key
comes from the trial's seed (a counter-based random generator: any element can be drawn on its
own). Inputs of any size — 2^32 elements and more — cost nothing until read, so the interpreter
can execute the real kernel's address arithmetic, int32 wrap-around included, at the real shape.
"""

from __future__ import annotations

import hashlib

import numpy as np

from habu.spec.field import _mix

# a virtual tensor read past its size is drawn whole if it holds at most this many elements (int32: 1 GB), in chunks
CACHE_ELEMENTS = 1 << 28
CACHE_CHUNK = 1 << 22
# a written tensor read at many offsets keeps a dense copy of its writes if it holds at most this many elements
DENSE_ELEMENTS = 1 << 26


def key_for(seed: int, name: str) -> np.uint64:
    digest = hashlib.sha256(f"input:{seed}:{name}".encode()).digest()
    return np.uint64(int.from_bytes(digest[:8], "little"))


class VirtualTensor:
    """An input tensor with random residues (or, for index tensors, random indices in range).

    An index tensor's values are weighted towards the ends of their range: one in 16 is the first
    index and one in 16 the last, so a checked tile always gathers the last row (where a read past
    a row's end leaves the tensor: a fault the check reports) as well as random ones. With
    `out_of_range`, one in four is outside the range (one past the last, -1, or a million off either
    way): values the kernels' index checks must mask (`habu.prove.verify.check_index_masking`). A `length`
    tensor (a mask's bound: `KindProof.length_ranges`) holds the last value in half its elements: a split
    decode's combine is wrong only where a checked sequence reaches past its first split, which uniform
    lengths left to chance (two checked sequences of 300 keys both inside the first of three splits: 2 draws
    in 7)."""

    def __init__(self, name: str, shape: tuple[int, ...], modulus: int, key: np.uint64, index: bool = False,
                 out_of_range: bool = False, length: bool = False):
        self.out_of_range = out_of_range  # an index tensor: one in 16 values is `modulus`, one in 16 is -1
        self.length = length  # an index tensor bounding a mask: 8 values in 16 are the last
        self.name = name
        self.shape = shape
        self.modulus = modulus
        self.key = key
        self.index = index
        self.numel = int(np.prod(shape, dtype=object)) if shape else 1
        self.strides = tuple(int(np.prod(shape[i + 1:], dtype=object)) for i in range(len(shape)))
        self._drawn = 0  # elements the reads have drawn so far (`at`)
        self._cache: np.ndarray | None = None

    def at(self, offsets: np.ndarray) -> np.ndarray:
        """Values at flat offsets (int64, already bounds-checked). Once the reads have drawn more elements than
        the tensor holds (a gathered weight read by every routed row, a loop's operand read by every lane), the
        tensor is drawn once whole (`CACHE_ELEMENTS` at most) and later reads index it: the same values."""
        offsets = np.asarray(offsets, dtype=np.int64)
        cache = self._cache
        if cache is None:
            self._drawn += offsets.size
            if self._drawn <= self.numel or self.numel > CACHE_ELEMENTS:
                return self.draw(offsets)
            cache = self._cache = self._draw_whole()
        return cache[offsets].astype(np.int64)

    def _draw_whole(self) -> np.ndarray:
        """Every element, drawn in chunks (int32 where every value fits: residues below a prime under 2^31)."""
        small = not self.index and self.modulus < 2**31 and type(self).draw is VirtualTensor.draw
        out = np.empty(self.numel, dtype=np.int32 if small else np.int64)
        for lo in range(0, self.numel, CACHE_CHUNK):
            hi = min(self.numel, lo + CACHE_CHUNK)
            out[lo:hi] = self.draw(np.arange(lo, hi, dtype=np.int64))
        return out

    def draw(self, offsets: np.ndarray) -> np.ndarray:
        """Values at flat offsets, each drawn from its hash."""
        h = _mix(np.asarray(offsets, dtype=np.int64).astype(np.uint64) ^ self.key)
        values = (h % np.uint64(self.modulus)).astype(np.int64)
        if not self.index:
            return values
        end = (h >> np.uint64(40)) & np.uint64(15)  # independent of the low bits the value came from
        last = (end >= 8) if self.length else (end == 1)
        values = np.where(end == 0, 0, np.where(last, self.modulus - 1, values))
        if self.out_of_range:  # what a caller's bad routing table holds: just past the end, negative, far off
            bad = np.select([end == 2, end == 3, end == 4, end == 5],
                            [self.modulus, -1, self.modulus + 1_000_003, -1_000_003], 0)
            values = np.where((end >= 2) & (end <= 5), bad, values)
        return values

    def __getitem__(self, idx: tuple) -> np.ndarray:
        if not self.shape:
            return self.at(np.zeros((), dtype=np.int64))
        arrays = np.broadcast_arrays(*[np.asarray(i, dtype=np.int64) for i in idx])
        off = np.zeros(arrays[0].shape, dtype=np.int64)
        for a, s in zip(arrays, self.strides, strict=True):
            off = off + a * s
        return self.at(off)

    def materialize(self) -> np.ndarray:
        return self.at(np.arange(self.numel, dtype=np.int64)).reshape(self.shape)


class GroupedVirtualTensor(VirtualTensor):
    """A grouping's values (`GROUPS: E ( #R #G )`): never decreasing, each row's group drawn at random
    among the groups the key leaves non-empty. About one group in four is empty (the first one in some
    trials); the last group never is, so a checked kernel reads the last group's weights."""

    def __init__(self, name: str, shape: tuple[int, ...], groups: int, key: np.uint64):
        super().__init__(name, shape, groups, key, index=True)
        ids = np.arange(groups, dtype=np.uint64)
        empty = (_mix(ids ^ key ^ np.uint64(0x5DEECE66D)) & np.uint64(3)) == 0
        empty[-1] = False
        live = np.flatnonzero(~empty)
        draws = _mix(np.arange(self.numel, dtype=np.uint64) ^ key) % np.uint64(len(live))
        self.table = np.sort(live[draws.astype(np.int64)]).astype(np.int64)

    def at(self, offsets: np.ndarray) -> np.ndarray:
        return self.table[np.asarray(offsets, dtype=np.int64)]


class PairVirtualTensor(VirtualTensor):
    """An input of the Z_q × GF(p) check (habu.spec.field_exp): each element a packed pair x_q · 2^31 + x_p,
    x_q drawn below q and x_p below p from two independent hashes of its offset."""

    def __init__(self, name: str, shape: tuple[int, ...], q: int, p: int, key: np.uint64):
        super().__init__(name, shape, p, key)
        self.q = q

    def draw(self, offsets: np.ndarray) -> np.ndarray:
        h = _mix(np.asarray(offsets, dtype=np.int64).astype(np.uint64) ^ self.key)
        xq = (h % np.uint64(self.q)).astype(np.int64)
        xp = (_mix(h ^ np.uint64(0x2545F4914F6CDD1D)) % np.uint64(self.modulus)).astype(np.int64)
        return (xq << 31) | xp


class WrittenTensor:
    """A tensor a kernel writes: which flat offsets hold which values (sparse), with write counts.

    With a `base` (a scatter adding into its target's prior contents) every element holds a value:
    the base's plus the sum of what was added there. `accumulate` "max": the writes are partial maxima
    (over GF(p) the products of (point − x), habu.spec.field) merged by their product, as an atomic max
    of partials merges them."""

    def __init__(self, name: str, numel: int, p: int, accumulate: bool | str, base: VirtualTensor | None = None):
        self.name = name
        self.numel = numel
        self.p = p
        self.accumulate = accumulate
        self.base = base
        self.offsets: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self._index: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._dense: tuple[np.ndarray, np.ndarray] | None = None  # (values, written?) of every element (`read`)

    def write(self, offsets: np.ndarray, values: np.ndarray) -> None:
        self.offsets.append(np.asarray(offsets, dtype=np.int64).ravel())
        self.values.append(np.asarray(values, dtype=np.int64).ravel())
        self._index = None
        self._dense = None

    def _build(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._index is None:
            if self.offsets:
                off = np.concatenate(self.offsets)
                val = np.concatenate(self.values)
            else:
                off = np.zeros(0, np.int64)
                val = np.zeros(0, np.int64)
            uniq, inverse, counts = np.unique(off, return_inverse=True, return_counts=True)
            sums = np.zeros(len(uniq), dtype=np.int64)
            if self.accumulate == "max":
                sums[:] = 1
                for i, v in zip(inverse.tolist(), val.tolist(), strict=True):
                    sums[i] = sums[i] * v % self.p
            elif self.accumulate:
                np.add.at(sums, inverse, val)
                sums %= self.p
            else:
                sums[inverse] = val  # the last writer wins, as in memory
            self._index = (uniq, sums, counts)
        return self._index

    def read(self, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(values, written?) at flat offsets (in bounds). A read of at least a quarter as many offsets as the
        tensor holds (`DENSE_ELEMENTS` at most) indexes a dense copy of the writes, made once until the next
        write, where the others search the written offsets."""
        uniq, sums, _ = self._build()
        off = np.asarray(offsets, dtype=np.int64)
        if self._dense is None and self.numel <= min(DENSE_ELEMENTS, 4 * off.size):
            values, written = np.zeros(self.numel, dtype=np.int64), np.zeros(self.numel, dtype=bool)
            values[uniq], written[uniq] = sums, True
            self._dense = (values, written)
        if self._dense is not None:
            found = self._dense[1][off]
            vals = self._dense[0][off]
        else:
            pos = np.searchsorted(uniq, off)
            pos_c = np.minimum(pos, max(len(uniq) - 1, 0))
            found = (len(uniq) > 0) & (uniq[pos_c] == off) if len(uniq) else np.zeros(off.shape, bool)
            vals = np.where(found, sums[pos_c] if len(uniq) else 0, 0)
        if self.base is not None:
            return (vals + self.base.at(off)) % self.p, np.ones(off.shape, bool)
        return vals, found

    def multiply_written(self) -> tuple[np.ndarray, np.ndarray]:
        """Offsets written more than once, and how often (a race unless accumulating)."""
        uniq, _, counts = self._build()
        mask = counts > 1
        return uniq[mask], counts[mask]
