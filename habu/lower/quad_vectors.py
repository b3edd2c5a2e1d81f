"""An accumulator fragment's rows stored as 16-byte vectors: the lanes of a row trade their column pairs by xor
shuffles until each holds `words` adjacent pairs, then store them with one vector store.

The accumulator fragment (habu/lower/fragments.py) gives lane l of a row's 4 lanes the pair of columns
8j + 2(l % 4) + q, q = 0, 1, of every 8-column group j: stored as it stands, a warp's store instruction writes
8 rows × 4 lanes × one pair, and the output's 2-byte elements go out one at a time (the wgmma attention
kernel's epilogue: 64 stores a thread a tile, 75% of the sectors wasted, ncu 2026-12-03). Here the lanes of a
row form groups of `words` lanes (lane l is lane `l % words` of its group, t = l % words) and, for each set u
of `words` adjacent column groups, lane t of a group ends up with the `words` pairs of column group
`words·u + t` that the group's lanes held: columns `vector_column(u, l)` .. + 2·words − 1, contiguous.

    round r = 0 .. words − 1: every lane sends its pair of group `sent_group(u, l, r)` = words·u + (t ^ r)
        and receives lane l ^ `offset(r)`'s (`__shfl_xor_sync`; round 0 keeps its own), which is the pair of
        its vector's group held by lane (l ^ r): it fills slot `slot(l, r)` = t ^ r of the vector
    the vector: slots s = 0 .. words − 1 (pairs at columns vector_column + 2s, + 1), at row `row(warp, l, h)`

A lane's choice of what to send and where a received pair goes depends on its t, which the emitter prints as
selects over t's values (registers cannot be indexed at run time) from these functions; the finite-field
interpreter (habu/prove/interp_attention_wgmma.py) runs the same rounds lane by lane with the shuffle's
definition (lane l receives lane l ^ offset's value, PTX ISA shfl.sync.bfly) and writes each vector's elements
where `element` says, so a wrong group, slot, offset or column moves values in the field check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from habu.lower.fragments import ACCUMULATOR, AccumulatorFragment

VECTOR_BYTES = 16  # one st.global.v4.b32


@dataclass(frozen=True)
class QuadVectors:
    """The exchange and the vector stores of an accumulator's rows (see the module's text)."""

    words: int  # pairs a vector: lanes trading in one group (divides the fragment's lanes a row)
    groups: int  # 8-column groups a row half holds (the accumulator's width / 8)
    fragment: AccumulatorFragment = ACCUMULATOR

    def __post_init__(self) -> None:
        if self.fragment.lanes_per_row % self.words or self.groups % self.words:
            raise ValueError(f"{self.words}-pair vectors need groups of lanes and column groups divisible by "
                             f"{self.words} ({self.fragment.lanes_per_row} lanes a row, {self.groups} groups)")

    @property
    def sets(self) -> int:
        """Vectors a lane stores a row half: one for each `words` adjacent column groups."""
        return self.groups // self.words

    @property
    def rounds(self) -> range:
        return range(self.words)

    @property
    def elements(self) -> int:
        """Output elements a vector: `words` pairs."""
        return self.words * self.fragment.pair

    def lane_in_group(self, lane: Any) -> Any:
        """t: the lane's place among the `words` lanes it trades with."""
        return lane % self.words

    def offset(self, r: int) -> int:
        """The xor of round r's shuffle: lane l receives lane l ^ offset(r)'s value (0: its own)."""
        return r

    def sent_group(self, u: Any, lane: Any, r: int) -> Any:
        """The column group whose pair the lane sends in round r of set u: the group of the vector of the lane it
        sends to (l ^ r has t ^ r)."""
        return self.words * u + (self.lane_in_group(lane) ^ r)

    def slot(self, lane: Any, r: int) -> Any:
        """The vector slot round r's received pair fills (it came from lane l ^ r, whose pair is t ^ r's of the
        group)."""
        return self.lane_in_group(lane) ^ r

    def vector_group(self, u: Any, lane: Any) -> Any:
        """The column group of the lane's vector of set u."""
        return self.words * u + self.lane_in_group(lane)

    def vector_column(self, u: Any, lane: Any) -> Any:
        """The first column of the lane's vector of set u: its group's, plus the pairs of the lanes before the
        lane's trading group in the row."""
        f = self.fragment
        return f.col_step * self.vector_group(u, lane) + f.pair * self.words * ((lane % f.lanes_per_row) // self.words)

    def position(self, s: Any, q: Any) -> Any:
        """Element q of slot s's place in the vector (its column less the vector's first): the emitter packs the
        pairs' words in this order, the interpreter stores the element this far from `vector_column`."""
        return self.fragment.pair * s + q

    def row(self, warp: Any, lane: Any, h: Any) -> Any:
        """The row (within the fragment's tile) of the lane's row half h: the fragment's."""
        return self.fragment.element(warp, lane, 0, h, 0)[0]

    def element(self, warp: Any, lane: Any, u: Any, h: Any, s: Any, q: Any) -> tuple[Any, Any]:
        """(row, column) of element q of slot s of the lane's vector of set u, row half h."""
        return self.row(warp, lane, h), self.vector_column(u, lane) + self.position(s, q)


def quad_vectors(groups: int, element_bytes: int, fragment: AccumulatorFragment = ACCUMULATOR) -> QuadVectors | None:
    """16-byte vectors of a row of `groups` 8-column groups of `element_bytes` elements, or None where a pair is
    wider than a vector or the groups do not split into vectors."""
    pair_bytes = fragment.pair * element_bytes
    if pair_bytes > VECTOR_BYTES or VECTOR_BYTES % pair_bytes:
        return None
    words = min(VECTOR_BYTES // pair_bytes, fragment.lanes_per_row)
    if words < 2 or groups % words:
        return None
    return QuadVectors(words, groups, fragment)


__all__ = ["VECTOR_BYTES", "QuadVectors", "quad_vectors"]
