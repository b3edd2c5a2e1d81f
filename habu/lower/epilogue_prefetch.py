"""The epilogue's lines prefetched into the L2 (the plan's `epilogue_prefetch`), as data: at each tile's start the
producer warpgroup's 128 threads walk the tile's rows of each matrix the epilogue loads (an access over m and n,
such as the saved S1 that GELU's derivative reads) line by line,

    line i (i = ptid, ptid + 128, ...) of `rows · lines_per_row`:  row m0 + i / lines_per_row,
                                                                   column n0 + (i % lines_per_row) · line_elems

and prefetch each inside the access's masks (`habu::prefetch_l2`). A prefetch changes no value, so the field check
has nothing to run; its addresses are the access's own offsets under the access's masks, which the bounds and int32
rules cover as they cover the epilogue's loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from habu.lower.access import Access
from habu.spec.dtypes import DTYPES

LINE_BYTES = 128


@dataclass(frozen=True)
class EpiloguePrefetch:
    access: Access  # the epilogue load whose tile is prefetched
    rows: int  # the tile's rows (BM)
    lines_per_row: int  # 128-byte lines a row of the tile's BN columns spans
    line_elems: int  # elements of one line
    threads: int = 128  # the producer warpgroup

    @property
    def lines(self) -> int:
        return self.rows * self.lines_per_row

    def row(self, i: Any) -> Any:
        """The tile row of line i."""
        return i // self.lines_per_row

    def column(self, i: Any) -> Any:
        """The tile column that starts line i."""
        return (i % self.lines_per_row) * self.line_elems


def epilogue_prefetches(epi_loads: tuple, bm: int, bn: int) -> tuple[EpiloguePrefetch, ...]:
    """The prefetches of the epilogue loads that read a tile of a matrix: positions over m and n (n contiguous),
    no gather; a bias (one row) or a per-row value is left to the loads themselves."""
    out = []
    for _ld, acc in epi_loads:
        kinds = [(p.kind, p.axis) for p in acc.positions]
        if ("axis", "m") in kinds and kinds[-1] == ("axis", "n") and all(k != "gather" for k, _ in kinds):
            e = DTYPES[acc.dtype].bytes
            per_line = LINE_BYTES // e
            out.append(EpiloguePrefetch(acc, bm, -(-bn // per_line), per_line))
    return tuple(out)


__all__ = ["EpiloguePrefetch", "epilogue_prefetches"]
