"""O's 16-byte vector stores (habu/lower/quad_vectors.py): the lanes of an accumulator row trade column pairs by
xor shuffles so that each stores `words` adjacent pairs at once. Run here as the shuffle defines it (lane l
receives lane l ^ offset's value), element by element: every element of a fragment tile arrives once, at its own
(row, column)."""

from __future__ import annotations

import numpy as np
import pytest

from habu.lower.fragments import ACCUMULATOR
from habu.lower.quad_vectors import QuadVectors, quad_vectors


def _exchange(qv: QuadVectors) -> dict[tuple[int, int], tuple[int, int]]:
    """(row, column) stored -> (row, column) of the accumulator element whose value lands there, one warp."""
    f = qv.fragment
    held = {(lane, g, h, q): f.element(0, lane, g, h, q) for lane in range(32) for g in range(qv.groups)
            for h in range(f.halves) for q in range(f.pair)}
    stored: dict[tuple[int, int], tuple[int, int]] = {}
    for u in range(qv.sets):
        for h in range(f.halves):
            vec: dict[tuple[int, int], list[tuple[int, int]]] = {}
            for r in qv.rounds:
                for lane in range(32):
                    sender = lane ^ qv.offset(r)
                    pair = [held[(sender, qv.sent_group(u, sender, r), h, q)] for q in range(f.pair)]
                    vec[(lane, qv.slot(lane, r))] = pair
            for lane in range(32):
                for s in range(qv.words):
                    for q in range(f.pair):
                        at = qv.element(0, lane, u, h, s, q)
                        assert at not in stored, f"{at} stored twice"
                        stored[at] = vec[(lane, s)][q]
    return stored


@pytest.mark.parametrize(("dtype_bytes", "groups", "words"), [(2, 16, 4), (2, 8, 4), (4, 16, 2), (4, 8, 2)])
def test_every_element_lands_once_at_its_own_place(dtype_bytes, groups, words):
    qv = quad_vectors(groups, dtype_bytes)
    assert qv is not None and qv.words == words and qv.elements * dtype_bytes == 16
    stored = _exchange(qv)
    assert len(stored) == 16 * 8 * groups  # a warp's 16 rows × the row's columns
    assert all(at == came for at, came in stored.items())


def test_a_vector_is_a_contiguous_aligned_run_of_one_row():
    qv = quad_vectors(16, 2)
    assert qv is not None
    lanes = np.arange(32)
    for u in range(qv.sets):
        first = np.asarray(qv.vector_column(u, lanes))
        assert np.all(first % qv.elements == 0)
        cols = [qv.element(0, lanes, u, 0, s, q)[1] for s in range(qv.words) for q in range(2)]
        assert all(np.all(c == first + i) for i, c in enumerate(cols))


def test_no_vectors_where_a_pair_is_wider_than_a_vector_or_the_groups_do_not_split():
    assert quad_vectors(16, 8) is None  # f64 pairs: 16 bytes, nothing to trade
    assert quad_vectors(6, 2) is None  # 6 groups: not whole sets of 4
    with pytest.raises(ValueError, match="divisible"):
        QuadVectors(3, 16, ACCUMULATOR)


def test_a_wrong_slot_map_lands_elements_elsewhere():
    """The check the field interpreter makes, in miniature: a planted slot map moves values."""
    class Planted(QuadVectors):
        def slot(self, lane, r):
            return (self.lane_in_group(lane) + r) % self.words

    stored = _exchange(Planted(4, 16, ACCUMULATOR))
    assert any(at != came for at, came in stored.items())
