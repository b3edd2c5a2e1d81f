"""The split-KV (flash-decoding) end of a fused attention kernel, printed from the `AttentionLowering`.

A block of split s has run the online softmax over its KV tiles (`first_tile(s)` .. `end_tile(s, tiles)`);
instead of O / l it keeps its partial in the launch's workspaces: each lane its unnormalised O registers
at `partial_offset(s, flat, row, d)`, the first lane of each row (`lanes_per_row`) the row's running
maximum m and sum l at `partial_slot(s, flat, row)` (a split with no visible key keeps m = −∞, l = 0,
O = 0). It then counts itself on its query tile's counter (`counter_slot`, a slot of a zero-filled
workspace; `habu::last_block_done`, the threadFenceReduction pattern), and the block completing the count
(`arrivals`: the splits) combines the partials of every split: for each output element of the tile
(`combine_element`, its threads striding over `combine_count`), M = max over splits of m, and
O = Σ_s exp(m_s − M)·O_s / Σ_s exp(m_s − M)·l_s (`combine_exponent`; div0: a row with no visible key is 0).
The scores are in base 2 (as in the kernel), so the factor is one ex2; the shift of M is
`habu::softmax_shift` (0 where every split is empty). The partials are read with ld.global.cg (L2: other
blocks wrote them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from habu.emit_cuda.attention_text import FloatOps
from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import Signature, access_mask, access_offset, store_value
from habu.lower.attention import AttentionLowering
from habu.lower.attention_wgmma import AttentionWgmmaLowering

FULL_UNROLL_SPLITS = 64  # a combine over at most this many splits unrolls its split loops whole


def split_workspaces(lw: AttentionLowering) -> tuple[tuple[str, str, tuple[str, ...]], ...]:
    """The launch's workspaces: the partial O, m and l of each split, and the query tiles' counters."""
    o, m, l_ = lw.partial_tensors
    rows = lw.partial_extents()
    return ((o, "f32", (*rows, lw.col_extent)), (m, "f32", rows), (l_, "f32", rows),
            (lw.counter_tensor, "i32", lw.counter_extents()))


def split_epilogue(lw: AttentionLowering, sig: Signature, sizes: Any, it: str, table: Callable[..., str], rt: str,
                   o_elem: list[str], h_q: str, o_coord: dict[str, str]) -> str:
    fr = lw.fragment
    cx = CExpr
    po_part, pm, pl = (sig.pointer(t, "f32", writes=True) for t in lw.partial_tensors)
    split, flat, qt = cx("split"), cx("flat"), cx("qt")
    row_of = lambda t: c(lw.row(qt, cx(t)))  # noqa: E731
    inside = c(lw.row_inside(cx("i"), sizes))
    part = c(lw.partial_offset(split, flat, cx("i"), cx("d"), sizes))
    slot = c(lw.partial_slot(split, flat, cx("i"), sizes))
    m_row = c(fr.element(cx("rt"), cx("lane"), 0, cx("h"), 0)[0])
    lead = c(cx("lane") % fr.lanes_per_row)
    return f"""  // this split's partial: each lane's unnormalised O registers; m and l of its rows from their first lane
#pragma unroll
  for (int mi = 0; mi < {lw.sets_per_warp}; ++mi) {{
    const int rt = {rt};
#pragma unroll
    for (int h = 0; h < {fr.halves}; ++h) l[mi][h] = habu::row_sum_lanes<{", ".join(str(x) for x in lw.quad_offsets)}>(l[mi][h]);
#pragma unroll
    for (int dn = 0; dn < {lw.out_groups}; ++dn)
#pragma unroll
      for (int q = 0; q < {lw.registers}; ++q) {{
        const {it} i = ({it})({row_of(o_elem[0])});
        const {it} d = ({it})({o_elem[1]});
        if ({inside}) {po_part}[{part}] = o[mi][dn][q];
      }}
    if ({lead} == 0) {{
#pragma unroll
      for (int h = 0; h < {fr.halves}; ++h) {{
        const {it} i = ({it})({row_of(m_row)});
        if ({inside}) {{ {pm}[{slot}] = m[mi][h]; {pl}[{slot}] = l[mi][h]; }}
      }}
    }}
  }}
{split_combine(lw, sig, sizes, it, table, o_coord)}"""


@dataclass(frozen=True)
class CombineThreads:
    """The threads that count a block and combine: the whole block (`tid`, `lw.threads`, __syncthreads, the
    block's shared memory at `smem`), or a warp-specialised kernel's consumer warpgroups (their own index, their
    count, a named barrier, the aligned shared-memory base)."""

    tid: str = "tid"
    threads: int | None = None  # None: the lowering's threads
    sync: str = "__syncthreads();"
    smem: str = "smem"
    barrier: int | None = None  # the named barrier of `last_block_done_among`; None: `last_block_done`
    leader: str = "0"


def split_combine(lw: AttentionLowering, sig: Signature, sizes: Any, it: str, table: Callable[..., str],
                  o_coord: dict[str, str], by: CombineThreads = CombineThreads()) -> str:
    """The block completing its query tile's count combines every split's partial (after its own partial is
    stored, by registers or by the slices' merge); `by`: the threads that count and combine."""
    cx = CExpr
    po_part, pm, pl = (sig.pointer(t, "f32", writes=True) for t in lw.partial_tensors)
    counters = sig.pointer(lw.counter_tensor, "i32", writes=True)
    po = sig.pointer(lw.out.tensor, lw.out.dtype, writes=True)
    flat, qt = cx("flat"), cx("qt")
    row_of = lambda t: c(lw.row(qt, cx(t)))  # noqa: E731
    inside = c(lw.row_inside(cx("i"), sizes))
    s_slot = c(lw.partial_slot(cx("s"), flat, cx("i"), sizes))
    s_part = c(lw.partial_offset(cx("s"), flat, cx("i"), cx("d"), sizes))
    t_of, d_of = (c(x) for x in lw.combine_element(cx("e")))
    exponent = lw.combine_exponent("__ldcg(" + pm + " + " + s_slot + ")", "shift", FloatOps())
    counter = f"{counters} + ({c(lw.counter_slot(flat, qt, sizes))}), (int)({c(lw.arrivals(sizes))})"
    threads = by.threads or lw.threads
    last = (f"habu::last_block_done({counter})" if by.barrier is None else
            f"habu::last_block_done_among({counter}, {by.barrier}, {threads}, {by.leader})")
    tid = by.tid
    out_ok = f"{inside} && ({access_mask(lw.out, o_coord, sizes, table)})"
    store = store_value(lw.out.dtype, po, access_offset(lw.out, o_coord, sizes, lw.index_width, table),
                        "habu::f_div0(acc, sum)")
    reset = f"    if ({tid} == 0) {counters}[{c(lw.counter_slot(flat, qt, sizes))}] = {lw.counter_after(sizes)};  // left for the next launch\n"
    if lw.combine_in_smem(sizes):
        return _combine_by_weights(lw, sizes, it, last, out_ok, pm, pl, po_part, reset,
                                   store_value(lw.out.dtype, po, access_offset(lw.out, o_coord, sizes, lw.index_width,
                                                                               table), "habu::f_div0(acc, total)"), by,
                                   threads)
    return f"""  if ({last}) {{  // every split of the query tile is in: combine them
    for (int e = {tid}; e < {lw.combine_count}; e += {threads}) {{
      const {it} i = ({it})({row_of(t_of)});
      const {it} d = ({it})({d_of});
      if (!({out_ok})) continue;
      float mx = habu::neg_inf_f();
#pragma unroll 32
      for (int s = 0; s < (int)({c(lw.splits(sizes))}); ++s) mx = fmaxf(mx, __ldcg({pm} + {s_slot}));
      const float shift = habu::softmax_shift(mx);
      float acc = 0.0f, sum = 0.0f;
#pragma unroll 32
      for (int s = 0; s < (int)({c(lw.splits(sizes))}); ++s) {{
        const float w = habu::exp2_fast({exponent});  // a split with no visible key: m = −∞, w = 0
        sum += w * __ldcg({pl} + {s_slot});
        acc += w * __ldcg({po_part} + {s_part});
      }}
      {store}
    }}
{reset}  }}
"""


def _combine_by_weights(lw: AttentionLowering, sizes: Any, it: str, last: str, out_ok: str, pm: str, pl: str,
                        po_part: str, reset: str, store: str, by: CombineThreads, threads: int) -> str:
    """The combine with the splits' weights in shared memory (`combine_in_smem`): a thread a (split, row) pair
    reads m and l (`combine_pair`, `combine_w`, `combine_l`: one round trip to the L2 for both); a thread a row
    takes their maximum M, turns each m into its weight exp(m_s − M) (`combine_exponent`) and sums weight·l_s
    (`combine_total`); a thread an element then reads only the splits' O."""
    cx = CExpr
    flat, qt = cx("flat"), cx("qt")
    s_of, t_of = (c(x) for x in lw.combine_pair(cx("p"), sizes))
    row = c(lw.row(qt, cx("t")))
    inside = c(lw.row_inside(cx("i"), sizes))
    slot = c(lw.partial_slot(cx("s"), flat, cx("i"), sizes))
    w_at = f"wts[{c(lw.combine_w(cx('s'), cx('t')))}]"
    l_at = f"wts[{c(lw.combine_l(cx('s'), cx('t'), sizes))}]"
    total_at = f"wts[{c(lw.combine_total(cx('t'), sizes))}]"
    te, de = (c(x) for x in lw.combine_element(cx("e")))
    splits = c(lw.splits(sizes))
    n = lw.splits(sizes)
    # every split's load in flight at once (up to MAX_SPLITS: 64 registers of a thread): with `unroll 32`, 64 splits
    # took two L2 round trips a row and two an element
    unroll = "#pragma unroll" if isinstance(n, int) and n <= FULL_UNROLL_SPLITS else "#pragma unroll 32"
    exponent = lw.combine_exponent(w_at, "shift", FloatOps())
    part = c(lw.partial_offset(cx("s"), flat, cx("i"), cx("d"), sizes))
    return f"""  if ({last}) {{  // every split of the query tile is in: combine them, the splits' weights in shared memory
    float* wts = reinterpret_cast<float*>({by.smem});
    for (int p = {by.tid}; p < {c(lw.combine_pairs(sizes))}; p += {threads}) {{  // each split's m and l of each row
      const int s = {s_of}, t = {t_of};
      const {it} i = ({it})({row});
      if ({inside}) {{ {w_at} = __ldcg({pm} + {slot}); {l_at} = __ldcg({pl} + {slot}); }}
    }}
    {by.sync}
    for (int t = {by.tid}; t < {lw.kernel.bm}; t += {threads}) {{  // each row: M, the splits' weights, the total l
      const {it} i = ({it})({row});
      if (!({inside})) continue;
      float mx = habu::neg_inf_f();
{unroll}
      for (int s = 0; s < (int)({splits}); ++s) mx = fmaxf(mx, {w_at});
      const float shift = habu::softmax_shift(mx);
      float total = 0.0f;
{unroll}
      for (int s = 0; s < (int)({splits}); ++s) {{
        const float w = habu::exp2_fast({exponent});  // a split with no visible key: m = −∞, w = 0
        {w_at} = w;
        total += w * {l_at};
      }}
      {total_at} = total;
    }}
    {by.sync}
    for (int e = {by.tid}; e < {lw.combine_count}; e += {threads}) {{  // each element: Σ_s weight·O_s / total
      const int t = {te};
      const {it} i = ({it})({row});
      const {it} d = ({it})({de});
      if (!({out_ok})) continue;
      float acc = 0.0f;
{unroll}
      for (int s = 0; s < (int)({splits}); ++s) acc += {w_at} * __ldcg({po_part} + {part});
      const float total = {total_at};
      {store}
    }}
{reset}  }}
"""


def wgmma_split_epilogue(lw: AttentionWgmmaLowering, sig: Signature, sizes: Any, it: str, table: Callable[..., str],
                         o_coord: dict[str, str]) -> str:
    """The wgmma loop's split end (habu/lower/attention_wgmma.py), run by its consumer warpgroups: each lane's
    unnormalised O registers at `partial_offset` (O register (dn, h, q) at `o_element`), m and l of its rows from
    each row's first lane (`lanes_per_row`; m times the scale where the kernel keeps the raw scores' maximum,
    `partial_max_scaled`: the combine's exponents are the scaled scores'), then the count and the combine among the
    consumers (`CombineThreads`: their named barrier, the weights in the words below the barriers)."""
    fr = lw.fragment
    cx = CExpr
    po_part, pm, pl = (sig.pointer(t, "f32", writes=True) for t in lw.partial_tensors)
    split, flat, qt = cx("split"), cx("flat"), cx("qt")
    row_of = lambda t: c(lw.row(qt, t))  # noqa: E731
    inside = c(lw.row_inside(cx("i"), sizes))
    o_row, o_col = lw.o_element(cx("cw"), cx("warp"), cx("lane"), cx("dn"), cx("h"), cx("q"))
    m_row, _ = lw.o_element(cx("cw"), cx("warp"), cx("lane"), 0, cx("h"), 0)
    o_reg = c(lw.o_register(cx("dn"), cx("h"), cx("q")))
    part = c(lw.partial_offset(split, flat, cx("i"), cx("d"), sizes))
    slot = c(lw.partial_slot(split, flat, cx("i"), sizes))
    lead = c(cx("lane") % fr.lanes_per_row)
    threads = 128 * lw.consumers
    bar = lw.combine_barrier
    by = CombineThreads(tid="(tid - 128)", threads=threads, sync=f"habu::named_barrier_sync({bar}, {threads});",
                        smem="smem_aligned", barrier=bar, leader="128")
    m_value = "m[h] * scale" if lw.partial_max_scaled(sizes) else "m[h]"
    return f"""    // this split's partial: the unnormalised O registers; m and l of each row from its first lane
#pragma unroll
    for (int h = 0; h < {fr.halves}; ++h) l[h] = habu::row_sum_lanes<{", ".join(str(x) for x in lw.quad_offsets)}>(l[h]);
#pragma unroll
    for (int dn = 0; dn < {lw.out_groups}; ++dn)
#pragma unroll
      for (int h = 0; h < {fr.halves}; ++h)
#pragma unroll
        for (int q = 0; q < {fr.pair}; ++q) {{
          const {it} i = ({it})({row_of(o_row)});
          const {it} d = ({it})({c(o_col)});
          if ({inside}) {po_part}[{part}] = o[{o_reg}];
        }}
    if ({lead} == 0) {{
#pragma unroll
      for (int h = 0; h < {fr.halves}; ++h) {{
        const {it} i = ({it})({row_of(m_row)});
        if ({inside}) {{ {pm}[{slot}] = {m_value}; {pl}[{slot}] = l[h]; }}
      }}
    }}
    unsigned char* const smem_aligned = smem_raw + (smem_base - habu::smem_addr(smem_raw));  // the combine's words
{_indent(split_combine(lw, sig, sizes, it, table, o_coord, by))}"""


def _indent(text: str, pad: str = "  ") -> str:
    return "".join(pad + line + "\n" if line else "\n" for line in text.splitlines())
