"""The end of a fused attention kernel whose warps slice each KV tile's keys (`kv_warps` > 1), printed from
the `AttentionLowering`.

Each warp has run the online softmax over its slice of every KV tile (`key_slice`): its own running maximum
m, sum l and unnormalised O. Once every warp is past its last tile, the K/V buffers take the merge: each
lane stores its O registers at `merge_o(warp, row, d)`, the first lane of each row (`lanes_per_row`) the
row's m and l (summed over the row's lanes) at `merge_m` and `merge_l`. The block's threads then stride
over the tile's elements (`merge_element` over `merge_count`): M = the max of the row's slices' m (the
warps `merge_warp(row, s)`), and O = Σ_s exp(m_s − M)·O_s, l = Σ_s exp(m_s − M)·l_s (`merge_exponent`:
the online softmax's rescale, once a slice). Without split-KV the element is stored as O / l (div0: a
row with no visible key is 0); with split-KV the merged O, and from the element of column 0 (`row_writer`)
M and l, are the block's partial (habu/emit_cuda/emit_attention_split.py then counts the block and the
last split combines). The scores are in base 2, so each factor is one ex2; the shift of M is
`habu::softmax_shift` (0 where every slice is empty).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from habu.emit_cuda.attention_text import FloatOps
from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import Signature, access_mask, access_offset, store_value
from habu.emit_cuda.emit_attention_split import split_combine
from habu.lower.attention import AttentionLowering


def merge_epilogue(lw: AttentionLowering, sig: Signature, sizes: Any, it: str, table: Callable[..., str], rt: str,
                   o_elem: list[str], o_coord: dict[str, str]) -> str:
    fr = lw.fragment
    cx = CExpr
    qt, flat = cx("qt"), cx("flat")
    inside = c(lw.row_inside(cx("i"), sizes))
    m_row = c(fr.element(cx("rt"), cx("lane"), 0, cx("h"), 0)[0])
    lead = c(cx("lane") % fr.lanes_per_row)
    t_of, d_of = (c(x) for x in lw.merge_element(cx("e")))
    slice_warp = c(lw.merge_warp(cx("t"), cx("s")))
    m_at = f"merge[{c(lw.merge_m(cx('sw'), cx('t')))}]"
    exponent = lw.merge_exponent(m_at, "shift", FloatOps())
    if lw.kernel.kv_split:
        po_part, pm, pl = (sig.pointer(t, "f32", writes=True) for t in lw.partial_tensors)
        part = c(lw.partial_offset(cx("split"), flat, cx("i"), cx("d"), sizes))
        slot = c(lw.partial_slot(cx("split"), flat, cx("i"), sizes))
        writer = lw.row_writer(cx("d"))
        if isinstance(writer, bool):  # a comparison Python evaluated instead of printing it
            raise ValueError(f"the merge's row writer folded to {writer} instead of a condition on d")
        finish = (f"    {po_part}[{part}] = acc;  // this split's partial\n"
                  f"    if ({c(writer)}) {{ {pm}[{slot}] = mx; {pl}[{slot}] = sum; }}\n")
        ok = inside
        tail = split_combine(lw, sig, sizes, it, table, o_coord)
    else:
        po = sig.pointer(lw.out.tensor, lw.out.dtype, writes=True)
        finish = "    " + store_value(lw.out.dtype, po, access_offset(lw.out, o_coord, sizes, lw.index_width, table),
                                        "habu::f_div0(acc, sum)") + "\n"
        ok = f"{inside} && ({access_mask(lw.out, o_coord, sizes, table)})"
        tail = ""
    return f"""  // the warps' slices merge: their partials into shared memory (the K/V buffers, free now)
  __syncthreads();
  float* merge = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int mi = 0; mi < {lw.sets_per_warp}; ++mi) {{
    const int rt = {rt};
#pragma unroll
    for (int h = 0; h < {fr.halves}; ++h) l[mi][h] = habu::row_sum_lanes<{", ".join(str(x) for x in lw.quad_offsets)}>(l[mi][h]);
#pragma unroll
    for (int dn = 0; dn < {lw.out_groups}; ++dn)
#pragma unroll
      for (int q = 0; q < {lw.registers}; ++q) merge[{c(lw.merge_o(cx('warp'), cx(o_elem[0]), cx(o_elem[1])))}] = o[mi][dn][q];
    if ({lead} == 0) {{
#pragma unroll
      for (int h = 0; h < {fr.halves}; ++h) {{
        const int t = {m_row};
        merge[{c(lw.merge_m(cx('warp'), cx('t')))}] = m[mi][h];
        merge[{c(lw.merge_l(cx('warp'), cx('t')))}] = l[mi][h];
      }}
    }}
  }}
  __syncthreads();
  for (int e = tid; e < {lw.merge_count}; e += {lw.threads}) {{  // the tile's elements, merged over the slices
    const int t = {t_of};
    const {it} i = ({it})({c(lw.row(qt, cx('t')))});
    const {it} d = ({it})({d_of});
    if (!({ok})) continue;
    float mx = habu::neg_inf_f();
#pragma unroll
    for (int s = 0; s < {lw.kv_warps}; ++s) {{
      const int sw = {slice_warp};
      mx = fmaxf(mx, {m_at});
    }}
    const float shift = habu::softmax_shift(mx);
    float acc = 0.0f, sum = 0.0f;
#pragma unroll
    for (int s = 0; s < {lw.kv_warps}; ++s) {{
      const int sw = {slice_warp};
      const float w = habu::exp2_fast({exponent});  // a slice with no visible key: m = −∞, w = 0
      sum += w * merge[{c(lw.merge_l(cx('sw'), cx('t')))}];
      acc += w * merge[{c(lw.merge_o(cx('sw'), cx('t'), cx('d')))}];
    }}
{finish}  }}
{tail}"""
