"""Size buckets: a runtime extent compiled to a few specialised plans, one per range of its sizes.

A row kernel's best schedule depends on its row width (threads per row, the row kept in registers
or shared memory); a runtime width compiled once runs every width with the schedule of the widest.
So the runtime extents a row kernel's columns run along (`bucketed_extents`) are cut into *buckets*
(`size_buckets`): widths up to `SMALLEST_TOP` in one, then one per power of two, (2^(k-1), 2^k], up
to `LARGEST_TOP`, the rest in one — each clipped to the declared range and its multiple, empty ones
dropped. `256..65536%256` gives 9: 256 | 512 | 768..1024 | 1280..2048 | ... | 33024..65536.

Each bucket (a `cell` of the grid when several extents are bucketed) gets its own plan, made and
proven for the sizes of that bucket only: the plan's `ranges` field names them, and
`planned_model` proves, lowers and emits the plan against the model with those ranges
(`restricted`). The same `BucketGrid` is the call-time dispatch table (`BucketGrid.index`: one
bisection per bucketed extent), the list `habu compile` writes and the keys `habu search` stores:
nothing restates the bucket bounds.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from habu.spec.ir import Extent, Model

SMALLEST_TOP = 256  # sizes up to this share the first bucket (one warp of 16-byte bf16 chunks per row)
LARGEST_TOP = 131072  # sizes above this share the last bucket (no row of them stays on chip)

Ranges = tuple[tuple[str, int, int], ...]  # (extent, lo, hi): a plan's `ranges`


@dataclass(frozen=True)
class Bucket:
    """The sizes lo..hi (multiples of `multiple`) of one runtime extent."""

    extent: str
    lo: int
    hi: int
    multiple: int = 1

    def admits(self, n: int) -> bool:
        return self.lo <= n <= self.hi and n % self.multiple == 0

    def describe(self) -> str:
        return f"#{self.extent} in {self.lo}..{self.hi}"


def _ceil_to(n: int, m: int) -> int:
    return -(-n // m) * m


def size_buckets(extent: Extent) -> tuple[Bucket, ...]:
    """The buckets of a runtime extent (see the module's doc); a static extent has none."""
    if extent.is_static:
        return ()
    m = max(1, extent.multiple)
    lo, hi = _ceil_to(extent.lo, m), extent.hi - extent.hi % m
    tops = [SMALLEST_TOP]
    while tops[-1] < LARGEST_TOP:
        tops.append(2 * tops[-1])
    out: list[Bucket] = []
    start = lo
    for top in [*tops, hi]:
        if start > hi:
            break
        end = min(hi, top - top % m)
        if end >= start:
            out.append(Bucket(extent.name, start, end, m))
            start = end + m
    return tuple(out)


def bucketed_extents(model: Model) -> tuple[str, ...]:
    """The runtime extents a plan is specialised on: the columns of every row kernel's rows (the row
    width), in the model's extent order. Other runtime extents are compiled once for their range."""
    from habu.plan.patterns import default_regions, row_local

    if all(e.is_static for e in model.extents):
        return ()
    widths: set[str] = set()
    for region in default_regions(model):
        if region.kind != "rows":
            continue
        last = next(eq for eq in model.nodes if eq.target == region.output)
        axes = row_local(last)
        widths.add(axes[1] if axes else last.lhs[-1].extent)
    return tuple(e.name for e in model.extents if e.name in widths and not e.is_static)


class BucketMiss(ValueError):
    """A size that no bucket holds."""


@dataclass(frozen=True)
class BucketGrid:
    """The buckets of each bucketed extent; a cell (one bucket of each) is one plan of the set,
    numbered row-major in `cells()` order."""

    axes: tuple[tuple[Bucket, ...], ...]
    _tops: tuple[list[int], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_tops", tuple([b.hi for b in axis] for axis in self.axes))

    @staticmethod
    def of(model: Model) -> BucketGrid:
        """The grid of `model`'s bucketed extents (none: one cell, the declared ranges)."""
        names = bucketed_extents(model)
        return BucketGrid(tuple(size_buckets(model.extent(n)) for n in names))

    def cells(self) -> list[tuple[Bucket, ...]]:
        return list(itertools.product(*self.axes))

    def __len__(self) -> int:
        n = 1
        for axis in self.axes:
            n *= len(axis)
        return n

    @property
    def extents(self) -> tuple[str, ...]:
        return tuple(axis[0].extent for axis in self.axes)

    def index(self, sizes: Mapping[str, int]) -> int:
        """The cell holding `sizes`: one bisection per bucketed extent (the call-time dispatch)."""
        cell = 0
        for axis, tops in zip(self.axes, self._tops, strict=True):
            name = axis[0].extent
            n = int(sizes[name])
            i = bisect.bisect_left(tops, n)
            if i == len(axis) or not axis[i].admits(n):
                held = ", ".join(f"{b.lo}..{b.hi}" if b.lo != b.hi else str(b.lo) for b in axis)
                raise BucketMiss(f"#{name} = {n} is in no bucket of the kernel set (its buckets: {held}"
                                 + (f", multiples of {axis[0].multiple}" if axis[0].multiple > 1 else "") + ")")
            cell = cell * len(axis) + i
        return cell



def cell_ranges(cell: Iterable[Bucket]) -> Ranges:
    """A cell as a plan's `ranges`."""
    return tuple((b.extent, b.lo, b.hi) for b in cell)


def describe_ranges(ranges: Ranges) -> str:
    return ", ".join(f"#{n} in {lo}..{hi}" for n, lo, hi in ranges)


def range_guards(ranges: Ranges) -> tuple[str, ...]:
    """A plan's `ranges` as guards (`4352 <= D`, `D <= 8192`): the bucket choice of a launcher that
    evaluates guards (`habu export`'s C launcher, which tries its members in order)."""
    return tuple(g for name, lo, hi in ranges for g in (f"{lo} <= {name}", f"{name} <= {hi}"))


def restricted(model: Model, ranges: Ranges) -> Model:
    """`model` with each named runtime extent narrowed to lo..hi (its declaration, and so the model's
    hash, kept). A static extent must lie in its range. ValueError for a range outside the declared
    one, or for an extent the model does not have."""
    if not ranges:
        return model
    wanted = {name: (lo, hi) for name, lo, hi in ranges}
    unknown = set(wanted) - {e.name for e in model.extents}
    if unknown:
        raise ValueError(f"the plan's ranges name {', '.join(sorted(unknown))}, not extents of {model.name}")
    extents = []
    for e in model.extents:
        if e.name not in wanted:
            extents.append(e)
            continue
        lo, hi = wanted[e.name]
        if e.is_static:
            if not lo <= int(e.size or 0) <= hi:
                raise ValueError(f"#{e.name} = {e.size} is outside the plan's range {lo}..{hi}")
            extents.append(e)
            continue
        if lo > hi or lo < e.lo or hi > e.hi:
            raise ValueError(f"the plan's range {lo}..{hi} of #{e.name} is not within its declared range "
                             f"({e.describe()})")
        extents.append(replace(e, lo=lo, hi=hi, declared=e.declaration()))
    return replace(model, extents=tuple(extents))


__all__ = ["LARGEST_TOP", "SMALLEST_TOP", "Bucket", "BucketGrid", "BucketMiss", "Ranges", "bucketed_extents",
           "cell_ranges", "describe_ranges", "range_guards", "restricted", "size_buckets"]
