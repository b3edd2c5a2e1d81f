"""The merge of a fused attention block's KV slices (`kv_warps` > 1) over Z_q × GF(p), as
habu/emit_cuda/emit_attention_merge.py prints it.

Each warp has run the online softmax over its slice of every KV tile. The merge area (the block's dynamic
shared memory, modelled as f32 words filled with a poison value: a word read that no lane wrote spoils
the result) receives each lane's O registers at `merge_o(warp, row, d)` and, from the first lane of each
row (`lanes_per_row`), the row's m and l at `merge_m`, `merge_l`. Then for each element of the tile
(`merge_element` over `merge_count`, rows inside #I): M = the max of the m of the row's slices (the warps
`merge_warp(row, s)`; over the field the product of the maxima, the identity 1 the empty maximum), and
O = Σ_s exp(e_s)·O_s, l = Σ_s exp(e_s)·l_s with e_s = `merge_exponent(m_s, M)`. Without split-KV the
element O / l (div0) is written to the output; with split-KV (O, M, l) is the block's partial
(`SplitRun.store_elements`: M and l from the element `row_writer` picks) and the block counts itself.

Sound for the same reason as the split combine (habu/prove/interp_attention_split.py): a slice's
O_s = Σ_{j in s} exp(S_j − m_s)·V_j times exp(m_s − M) is Σ_{j in s} exp(S_j − M)·V_j for any m_s, M,
exactly over the field; a merge that rescales wrong, reads another warp's slice or drops a slice leaves
factors that do not cancel (the mutants `attention-merge-rescale-inverted`, `attention-merge-one-slice`,
`attention-key-slice-ignores-warp`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from habu.lower.attention import AttentionLowering
from habu.prove.interp import Memory, write
from habu.prove.interp_attention_split import POISON, SplitRun


@dataclass
class MergeEnd:
    """Where the merged tile goes: the block's query tile, batch element and its coordinates, its split and
    the launch's split workspaces (None without split-KV), the field's max and sub."""

    qt: int
    flat: int
    coords: Mapping[str, Any]
    split_no: int
    split: SplitRun | None
    ops: Any


def merge_slices(name: str, lw: AttentionLowering, sizes: Mapping[str, int], mem: Memory, warp_of_sets: np.ndarray,
                 o: np.ndarray, o_row: np.ndarray, o_col: np.ndarray, m: np.ndarray, l_run: np.ndarray,
                 m_row: np.ndarray, end: MergeEnd, where: str) -> None:
    f = mem.field
    words = lw.smem_bytes() // 4
    merge = np.broadcast_to(f.const(POISON), (words,)).copy()

    def inside(what: str, at: np.ndarray) -> np.ndarray:
        bad = (at < 0) | (at >= words)
        if bad.any():
            mem.fault(f"{name}: {where} merges its slices' {what} at word {int(at[bad].flat[0])}, outside the "
                      f"block's {words} words of shared memory")
        return np.where(bad, 0, at)

    w4 = np.broadcast_to(warp_of_sets[:, None, None, None], o.shape)
    off = inside("O", np.asarray(lw.merge_o(w4, np.broadcast_to(o_row, o.shape), np.broadcast_to(o_col, o.shape))))
    merge[off] = o
    lead = np.broadcast_to((np.arange(32) % lw.fragment.lanes_per_row == 0)[None, :, None], m.shape)
    w3 = np.broadcast_to(warp_of_sets[:, None, None], m.shape)
    rows = np.broadcast_to(m_row, m.shape)
    merge[inside("m", np.asarray(lw.merge_m(w3, rows)))[lead]] = m[lead]
    merge[inside("l", np.asarray(lw.merge_l(w3, rows)))[lead]] = l_run[lead]
    t, d = (np.asarray(v, dtype=np.int64) for v in lw.merge_element(np.arange(lw.merge_count, dtype=np.int64)))
    keep = np.asarray(lw.row_inside(lw.row(end.qt, t), sizes))
    t, d = t[keep], d[keep]
    parts = []
    for s in range(lw.kv_warps):
        sw = np.asarray(lw.merge_warp(t, s), dtype=np.int64)
        parts.append((merge[inside("m", np.asarray(lw.merge_m(sw, t)))], merge[inside("l", np.asarray(lw.merge_l(sw, t)))],
                      merge[inside("O", np.asarray(lw.merge_o(sw, t, d)))]))
    m_all = np.broadcast_to(f.const(1), t.shape).copy()  # the empty maximum
    for m_s, _, _ in parts:
        m_all = end.ops.max(m_all, m_s)
    acc = np.broadcast_to(f.const(0), t.shape).copy()
    total = acc.copy()
    for m_s, l_s, o_s in parts:
        w = f.op("exp", [lw.merge_exponent(m_s, m_all, end.ops)])
        total = f.op("add", [total, f.op("mul", [w, l_s])])
        acc = f.op("add", [acc, f.op("mul", [w, o_s])])
    if end.split is not None:
        end.split.store_elements(name, end.split_no, end.flat, end.qt, t, d, acc, m_all, total, where)
        end.split.arrive(name, end.flat, end.qt, end.coords, end.ops, where)
        return
    out = f.op("div0", [acc, total])
    at = {**end.coords, "i": np.asarray(lw.row(end.qt, t)), "d": d}
    write(name, lw.out, at, out, sizes, mem, lw.index_width, False, None, lambda bad: where)
