"""The split-KV (flash-decoding) end of a fused attention kernel over Z_q × GF(p), as
habu/emit_cuda/emit_attention_split.py prints it.

A block of split s keeps its partial in the launch's workspaces (modelled here, filled with a poison value
at the start of the launch: a partial read that no block wrote spoils the result): each lane its O
registers, unnormalised, at `partial_offset`, the first lane of each row (`lanes_per_row`) the row's
running maximum m and sum l at `partial_slot` (the rows inside #I). It counts itself on its query tile's
counter (`counter_slot`, zero at the start; the combining block leaves it at `counter_after`, and after the
launch every counter must be zero again: the runtime zero-fills them once, when it allocates them, so each
launch starts where the last one ended); the block bringing the count to `arrivals` combines: for each
element of the tile (`combine_element` over `combine_count`), M = the max of every split's m (over the
field the product of the partial maxima, as the kernel's running maximum is), and O = Σ_s exp(e_s)·O_s /
Σ_s exp(e_s)·l_s with e_s = `combine_exponent(m_s, M)` (div0).

Why the check is sound for the split: over Z_q × GF(p) exp(a + b) = exp(a)·exp(b) holds exactly, so a
split's O_s = Σ_{j in s} exp(S_j − m_s)·V_j, multiplied by exp(m_s − M), is Σ_{j in s} exp(S_j − M)·V_j
whatever the values m_s and M are; summed over the splits and divided by l's sum, the factor exp(−M)
cancels and the result is the model's softmax-weighted sum exactly. A combine that rescales wrong
(exp(M − m_s), or l not rescaled) leaves factors exp(±2m_s) that do not cancel: the random inputs make the
result differ (the mutant `attention-combine-rescale-inverted`)."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from habu.lower.attention import AttentionLowering
from habu.prove.interp import Memory, write

POISON = Fraction(7919, 13)  # what a workspace holds before any block writes it


class SplitRun:
    """The launch's workspaces and counters, across the blocks the check runs."""

    def __init__(self, lw: AttentionLowering, sizes: Mapping[str, int], mem: Memory):
        f = mem.field
        assert lw.width_d is not None
        self.lw, self.sizes, self.mem = lw, sizes, mem
        self.slots = int(lw.partial_slots(sizes))
        self.o = np.broadcast_to(f.const(POISON), (self.slots * lw.width_d,)).copy()
        self.m = np.broadcast_to(f.const(POISON), (self.slots,)).copy()
        self.l = np.broadcast_to(f.const(POISON), (self.slots,)).copy()
        self.counters = np.zeros(int(lw.batch_count(sizes)) * int(lw.query_tiles(sizes)), dtype=np.int64)

    def _inside(self, name: str, what: str, at: np.ndarray, size: int, where: str) -> np.ndarray:
        bad = (at < 0) | (at >= size)
        if bad.any():
            self.mem.fault(f"{name}: {where} writes or reads its {what} at element {int(at[bad].flat[0])}, outside "
                           f"the workspace's {size}")
        return ~bad

    def store(self, name: str, split: int, flat: int, qt: int, o: np.ndarray, o_row: np.ndarray, o_col: np.ndarray,
              m: np.ndarray, l_run: np.ndarray, m_row: np.ndarray, where: str) -> None:
        """Split `split`'s partial of (flat, qt): `o` at the accumulator rows/columns, `m`, `l_run` (warp, lane,
        h) at the rows `m_row` (warp, lane, h), from each row's first lane."""
        lw, sizes = self.lw, self.sizes
        rows = np.broadcast_to(lw.row(qt, o_row), o.shape)
        keep = np.asarray(lw.row_inside(rows, sizes))
        off = np.asarray(lw.partial_offset(split, flat, rows, np.broadcast_to(o_col, o.shape), sizes))[keep]
        ok = self._inside(name, "partial O", off, self.o.size, where)
        self.o[off[ok]] = o[keep][ok]
        lead = (np.arange(32) % lw.fragment.lanes_per_row == 0)[None, :, None]
        rows = lw.row(qt, m_row)
        keep = np.broadcast_to(lead, rows.shape) & np.asarray(lw.row_inside(rows, sizes))
        slot = np.asarray(lw.partial_slot(split, flat, rows, sizes))[keep]
        ok = self._inside(name, "partial m and l", slot, self.slots, where)
        self.m[slot[ok]] = m[keep][ok]
        self.l[slot[ok]] = l_run[keep][ok]

    def store_elements(self, name: str, split: int, flat: int, qt: int, t: np.ndarray, d: np.ndarray, o: np.ndarray,
                       m: np.ndarray, l_run: np.ndarray, where: str) -> None:
        """Split `split`'s partial of (flat, qt) from the merge of its slices: O at the tile's rows t (inside #I)
        and columns d, m and l from the elements `row_writer` picks."""
        lw, sizes = self.lw, self.sizes
        rows = np.asarray(lw.row(qt, t))
        off = np.asarray(lw.partial_offset(split, flat, rows, d, sizes))
        ok = self._inside(name, "partial O", off, self.o.size, where)
        self.o[off[ok]] = o[ok]
        writer = np.asarray(lw.row_writer(d), dtype=bool)
        slot = np.asarray(lw.partial_slot(split, flat, rows, sizes))[writer]
        ok = self._inside(name, "partial m and l", slot, self.slots, where)
        self.m[slot[ok]] = m[writer][ok]
        self.l[slot[ok]] = l_run[writer][ok]

    def arrive(self, name: str, flat: int, qt: int, coords: Mapping[str, Any], ops: Any, where: str) -> None:
        """The block counts itself on its tile's counter; the last of the tile's splits combines."""
        lw, sizes = self.lw, self.sizes
        slot = int(lw.counter_slot(flat, qt, sizes))
        if not 0 <= slot < self.counters.size:
            self.mem.fault(f"{name}: {where} counts itself on counter {slot}, outside the launch's "
                           f"{self.counters.size}")
            return
        self.counters[slot] += 1
        if self.counters[slot] == int(lw.arrivals(sizes)):
            self._combine(name, flat, qt, coords, ops, where)
            self.counters[slot] = int(lw.counter_after(sizes))

    def finish(self, name: str) -> None:
        """After the launch: every counter is zero again (the runtime zero-fills them once, not before each
        launch: a counter left at n makes the next launch's combine run early or never)."""
        left = np.flatnonzero(self.counters)
        if left.size:
            self.mem.fault(f"{name}: the launch leaves element {int(left[0])} of the counters {self.lw.counter_tensor} "
                           f"at {int(self.counters[left[0]])}, not 0: the next launch would combine early or never")

    def _combine(self, name: str, flat: int, qt: int, coords: Mapping[str, Any], ops: Any, where: str) -> None:
        if self.lw.combine_in_smem(self.sizes):
            self._combine_by_weights(name, flat, qt, coords, ops, where)
            return
        lw, sizes, f = self.lw, self.sizes, self.mem.field
        t, d = (np.asarray(v, dtype=np.int64) for v in lw.combine_element(np.arange(lw.combine_count, dtype=np.int64)))
        rows = np.asarray(lw.row(qt, t))
        keep = np.asarray(lw.row_inside(rows, sizes))
        rows, d = rows[keep], d[keep]
        parts = []
        for s in range(int(lw.splits(sizes))):
            slot = np.asarray(lw.partial_slot(s, flat, rows, sizes), dtype=np.int64)
            off = np.asarray(lw.partial_offset(s, flat, rows, d, sizes), dtype=np.int64)
            ok = self._inside(name, "partial m and l", slot, self.slots, where) & \
                self._inside(name, "partial O", off, self.o.size, where)
            slot, off = np.where(ok, slot, 0), np.where(ok, off, 0)
            parts.append((self.m[slot], self.l[slot], self.o[off]))
        zero = f.const(Fraction(0))
        m_all = np.broadcast_to(f.const(Fraction(1)), rows.shape).copy()  # the empty maximum
        for m_s, _, _ in parts:
            m_all = ops.max(m_all, m_s)
        acc = np.broadcast_to(zero, rows.shape).copy()
        total = acc.copy()
        for m_s, l_s, o_s in parts:
            w = f.op("exp", [lw.combine_exponent(m_s, m_all, ops)])
            total = f.op("add", [total, f.op("mul", [w, l_s])])
            acc = f.op("add", [acc, f.op("mul", [w, o_s])])
        out = f.op("div0", [acc, total])
        at = {**coords, "i": rows, "d": d}
        write(name, lw.out, at, out, sizes, self.mem, lw.index_width, False, None, lambda bad: where)

    def _combine_by_weights(self, name: str, flat: int, qt: int, coords: Mapping[str, Any], ops: Any,
                            where: str) -> None:
        """The combine with the splits' weights in shared memory (`combine_in_smem`; the words poisoned first):
        each (split, row) pair's m at `combine_w` and l at `combine_l`, a row's pass turning the m into weights
        exp(m_s − M) and its total l at `combine_total`, then each element Σ_s weight·O_s / total."""
        lw, sizes, f = self.lw, self.sizes, self.mem.field
        words = lw.combine_words()
        cw = np.broadcast_to(f.const(POISON), (words,)).copy()

        def at(what: str, offs: Any) -> np.ndarray:
            offs = np.asarray(offs, dtype=np.int64)
            bad = (offs < 0) | (offs >= words)
            if bad.any():
                self.mem.fault(f"{name}: {where} combines with its {what} at word {int(offs[bad].flat[0])}, outside "
                               f"the block's {words} words of shared memory")
            return np.where(bad, 0, offs)

        splits = int(lw.splits(sizes))
        s, t = (np.asarray(v, dtype=np.int64) for v in lw.combine_pair(np.arange(int(lw.combine_pairs(sizes))), sizes))
        rows = np.asarray(lw.row(qt, t))
        keep = np.asarray(lw.row_inside(rows, sizes))
        slot = np.asarray(lw.partial_slot(s, flat, rows, sizes), dtype=np.int64)[keep]
        ok = self._inside(name, "partial m and l", slot, self.slots, where)
        cw[at("split weights", np.asarray(lw.combine_w(s, t))[keep][ok])] = self.m[slot[ok]]
        cw[at("split l", np.asarray(lw.combine_l(s, t, sizes))[keep][ok])] = self.l[slot[ok]]
        for row_t in range(lw.kernel.bm):  # a thread a row: M, the weights, the total l
            i = int(lw.row(qt, row_t))
            if not bool(lw.row_inside(i, sizes)):
                continue
            w_at = at("split weights", [lw.combine_w(sp, row_t) for sp in range(splits)])
            m_s = cw[w_at]
            m_all = f.const(Fraction(1))  # the empty maximum
            for v in m_s:
                m_all = ops.max(m_all, v)
            w = f.op("exp", [lw.combine_exponent(m_s, np.broadcast_to(m_all, m_s.shape), ops)])
            cw[w_at] = w
            l_s = cw[at("split l", [lw.combine_l(sp, row_t, sizes) for sp in range(splits)])]
            total = f.reduce("sum", f.op("mul", [w, l_s]), (0,))
            cw[at("total l", [lw.combine_total(row_t, sizes)])] = total
        t, d = (np.asarray(v, dtype=np.int64) for v in lw.combine_element(np.arange(lw.combine_count, dtype=np.int64)))
        rows = np.asarray(lw.row(qt, t))
        keep = np.asarray(lw.row_inside(rows, sizes))
        t, rows, d = t[keep], rows[keep], d[keep]
        acc = np.broadcast_to(f.const(Fraction(0)), rows.shape).copy()
        for sp in range(splits):
            off = np.asarray(lw.partial_offset(sp, flat, rows, d, sizes), dtype=np.int64)
            ok = self._inside(name, "partial O", off, self.o.size, where)
            term = f.op("mul", [cw[at("split weights", np.asarray(lw.combine_w(sp, t)))], self.o[np.where(ok, off, 0)]])
            acc = f.op("add", [acc, term])
        total = cw[at("total l", np.asarray(lw.combine_total(t, sizes)))]
        out = f.op("div0", [acc, total])
        write(name, lw.out, {**coords, "i": rows, "d": d}, out, sizes, self.mem, lw.index_width, False, None,
              lambda bad: where)
