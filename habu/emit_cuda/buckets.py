"""The call-time choice of a bucketed kernel set: a table lookup on the runtime sizes.

A model whose runtime row width is bucketed (habu/plan/buckets.py) compiles to one plan per bucket,
each proven for its bucket's sizes only (its `ranges`), each with its guarded members as any kernel
set has. `BucketedKernelSet` files every member under the bucket its plan's `ranges` name — the
slot is read from what was proven, never from a second list — and a call finds its bucket with one
bisection per bucketed extent (`BucketGrid.index`), then the first member of that bucket whose guards
hold (none to evaluate when the bucket has one unguarded member). A size in no bucket is refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

from habu.emit_cuda.arrays import ArgumentError
from habu.emit_cuda.guards import GuardError, KernelSet
from habu.plan.buckets import BucketGrid, BucketMiss, Ranges, cell_ranges, describe_ranges

T = TypeVar("T")


class BucketedKernelSet(KernelSet[T]):
    """Members grouped by bucket: `members` as (ranges, guards, member), the ranges a plan's."""

    def __init__(self, grid: BucketGrid, members: Iterable[tuple[Ranges, str | Sequence[str], T]]):
        slot = {cell_ranges(cell): i for i, cell in enumerate(grid.cells())}
        filed: list[list[tuple[str | Sequence[str], T]]] = [[] for _ in slot]
        for ranges, guards, member in members:
            i = slot.get(tuple(ranges))
            if i is None:
                raise GuardError(f"a member made for {describe_ranges(tuple(ranges)) or 'the declared ranges'} "
                                 f"is no bucket of the set (buckets: {_cells_text(grid)})")
            filed[i].append((guards, member))
        empty = [describe_ranges(cell_ranges(c)) for c, f in zip(grid.cells(), filed, strict=True) if not f]
        if empty:
            raise GuardError(f"no member for the bucket(s) {'; '.join(empty)}")
        super().__init__(m for f in filed for m in f)
        self.grid = grid
        self.spans: list[range] = []
        start = 0
        for f in filed:
            self.spans.append(range(start, start + len(f)))
            start += len(f)
        # buckets with one member and no guard: the bucket's member, no guard evaluated
        self._only: list[int | None] = [s.start if len(s) == 1 and not self.members[s.start][0] else None
                                        for s in self.spans]

    def index(self, sizes: Mapping[str, int]) -> int:
        try:
            cell = self.grid.index(sizes)
        except BucketMiss as miss:
            raise ArgumentError(str(miss)) from None
        only = self._only[cell]
        return only if only is not None else self.first_holding(sizes, self.spans[cell])

    def bucket_of(self, member: int) -> int:
        """The bucket (cell number) a member is filed under."""
        return next(i for i, s in enumerate(self.spans) if member in s)


def _cells_text(grid: BucketGrid) -> str:
    return "; ".join(describe_ranges(cell_ranges(c)) for c in grid.cells())


__all__ = ["BucketedKernelSet"]
