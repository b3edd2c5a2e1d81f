"""The fused attention kernel's Hopper main loop (FlashAttention-3 style), printed from the
`AttentionWgmmaLowering` (habu/lower/attention_wgmma.py; its docstring is the kernel's outline).

Warpgroup 0 is the producer: one thread loads Q's tile (TMA boxes on the Q barrier) and then each KV tile's
K and V boxes into the ring's stage (`MbarrierRing`: wait `empty`, arrive with the stage's bytes on `full`,
`habu::ring_advance`). Warpgroups 1.. are consumers of 64 query rows each: S = Q·Kᵀ by wgmma (both operands
from shared memory), the scale, the mask (tiles `unmasked` says need none skip it), the online softmax on
S's accumulator registers (`habu/attention/online.cuh`, in base 2 as the mma.sync kernel), P packed to bf16
registers as the A operand of O += P·V (wgmma with A from registers and V's MN-major tile, the transposed
B), one arrival on the stage's `empty` barrier, and at the end O · (1 / l) stored from the registers (one division a row).
Persistent (`--pin persistent=1`): the same per-tile code inside each warpgroup's walk over the work tiles, the
ring's state declared outside it, Q's barrier waited with the tile's parity and the Q-empty barrier arrived on once
the tile's last S is done (the producer waits it before the next tile's Q).
"""

from __future__ import annotations

from habu.emit_cuda.attention_exp import exp2_call
from habu.emit_cuda.attention_stats import statistics_store
from habu.emit_cuda.attention_text import FloatOps, batch_lines, chain_join, chain_slot, mask_term, no_load
from habu.emit_cuda.cexpr import CExpr, bare, c, cmin
from habu.emit_cuda.common import (
    GRID_LAUNCH,
    GRID_WAIT,
    Signature,
    access_mask,
    access_offset,
    condition_code,
    float_expr,
    header,
    index_type,
    store_value,
)
from habu.emit_cuda.emit_attention_split import split_workspaces, wgmma_split_epilogue
from habu.emit_cuda.emit_fma import table_reader
from habu.emit_cuda.emit_wgmma import ring_advance_line
from habu.emit_cuda.geometry import GRID_2D, LaunchGeometry, cmax, register_geometry
from habu.emit_cuda.kernel import CudaKernel, TmaSpec
from habu.emit_cuda.quad_store import quad_store_rows
from habu.emit_cuda.wgmma import wgmma_function, wgmma_name
from habu.lower.attention_wgmma import K_STEP, AttentionWgmmaLowering, wgmma_refusal
from habu.lower.contraction import tma_coordinates, tma_order
from habu.lower.layouts import WgmmaDescriptor
from habu.lower.pipeline import MbarrierRing
from habu.spec.ir import Model


def wgmma_rs_name(n: int) -> str:
    return f"habu_wgmma_rs_m64n{n}_bf16_bt"


def wgmma_rs_function(n: int) -> str:
    """`habu_wgmma_rs_m64n{n}_bf16_bt(float (&d)[n/2], const u32 (&a)[4], u64 desc_b)`: d += A·B with A (64 × 16
    bf16) from registers (the PTX ISA's register fragment A) and B MN-major from shared memory (transpose bit)."""
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    constraints = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    a = ", ".join(f"%{regs + i}" for i in range(4))
    name = wgmma_rs_name(n)
    guard = name.upper()
    return f"""#ifndef {guard}
#define {guard}
__device__ __forceinline__ void {name}(float (&d)[{regs}], const habu::u32 (&a)[4], habu::u64 desc_b) {{
  asm volatile(
      "{{\\n"
      ".reg .pred p;\\n"
      "setp.ne.b32 p, %{regs + 5}, 0;\\n"
      "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 "
      "{{{outs}}}, {{{a}}}, %{regs + 4}, p, 1, 1, 1;\\n"
      "}}\\n"
      : {constraints}
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}}
#endif
"""


def _desc(d: WgmmaDescriptor, start) -> str:
    return f"habu::wgmma_desc<{d.lbo}u, {d.sbo}u, {d.mode}u>(smem_base + (habu::u32)({c(start)}))"


def _barrier(ring: MbarrierRing, stage: str, empty: bool = False) -> str:
    return c(ring.empty_barrier(CExpr("bars"), CExpr(stage)) if empty else ring.full_barrier(CExpr("bars"), CExpr(stage)))


def emit_attention_wgmma(name: str, model: Model, lw: AttentionWgmmaLowering, static: dict[str, int]) -> CudaKernel:
    refused = wgmma_refusal(lw)
    if refused is not None:
        raise ValueError(f"{name}: {refused}")
    k, ring, split = lw.kernel, lw.ring, lw.split
    assert ring is not None and split is not None
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    table = table_reader(sig, model, it)
    n_e, n_d = sizes[lw.red_extent], sizes[lw.col_extent]
    bm, bn = k.bm, k.bn
    cx = CExpr
    batch = {a: a for a in lw.batch_axes}
    batch_code = batch_lines(lw, sizes, it)
    term = mask_term(table)

    limit = lw.key_limit(CExpr("(long long)qt"), sizes, term)
    open_limit = lw.open_limit(CExpr("(long long)qt"), sizes, term)
    split_on = bool(k.kv_split)
    split_no = CExpr("split") if split_on else 0
    first = lw.first_tile(split_no)  # the block's first KV tile (split-KV: its split's)
    tiles = lw.end_tile(split_no, lw.kv_tiles(
        CExpr(f"(long long)({c(limit)})"), sizes,
        lambda x, lo, hi: CExpr(f"min(max({c(x)}, (long long){c(lo)}), (long long)({c(hi)}))")))
    scale = "1.0f" if lw.scale is None else float_expr(lw.scale, no_load, sizes)
    mask = condition_code(lw.mask, sizes, table) if lw.mask is not None else "true"
    ops = FloatOps()
    shuffles = ", ".join(str(x) for x in lw.quad_offsets)

    # the tensor maps (dims: the accesses' bounded extents, innermost first; boxes of 64 head-width columns)
    def tmap(acc) -> str:
        box = lw.box_extent(acc)
        return sig.tensormap(TmaSpec(acc.tensor, acc.dtype, tuple(reversed(acc.bounded_extents())),
                                     tuple(box.get(a, 1) for a in tma_order(acc)), lw.qk_desc.swizzle))

    coords = {a: CExpr(a) for a in lw.batch_axes}
    bx = CExpr("bx")

    def load(acc, origin, dst: object, bar: str) -> str:
        at = ", ".join(f"(int)({c(x)})" for x in tma_coordinates(acc, origin))
        return f"habu::tma_load_{len(acc.positions)}d(smem_base + (habu::u32)({c(dst)}), &{tmap(acc)}, {bar}, {at});"

    q_loads = "\n".join(f"      {load(lw.q, lw.q_box_origin(cx('qt'), coords, b), lw.q_box_dst(b), 'q_bar')}"
                        f"  // Q's columns {64 * b}..: zero past #{lw.row_extent}" for b in range(lw.q_boxes))
    kv_loads = "\n".join(
        [f"        {load(lw.k, lw.k_box_origin(cx('kt'), coords, b), lw.k_box_dst(cx('stage'), b), 'full')}"
         f"  // K's columns {64 * b}..: zero past #{lw.key_extent}" for b in range(lw.q_boxes)]
        + [f"        {load(lw.v, lw.v_box_origin(cx('kt'), coords, b), lw.v_box_dst(cx('stage'), b), 'full')}"
           f"  // V's columns {64 * b}.." for b in range(lw.v_boxes)])
    q_bytes = bm * n_e * 2
    # S = Q·Kᵀ: #E/16 k steps, both operands K-major, K from stage `slot_var`
    def s_mma_for(slot_var: str, ind: str) -> str:
        return "\n".join(f"{ind}{wgmma_name(bn, 'bf16')}(s, {_desc(lw.qk_desc, lw.q_start(cx('cw'), kk))}, "
                         f"{_desc(lw.qk_desc, lw.k_start(cx(slot_var), kk))}, {int(kk > 0)});"
                         for kk in range(n_e // K_STEP))

    s_mma, s_mma_next = s_mma_for("slot", "      "), s_mma_for("nslot", "      ")
    # ping-pong: consumer cw waits on barrier turn_barrier(cw) before it issues, passes the other's after
    mine, other = c(lw.turn_barrier(cx("cw"))), c(lw.turn_barrier(cx("(1 - cw)")))
    turn_wait = f"      habu::turn_wait({mine});  // this warpgroup's turn to issue\n" if lw.pingpong else ""
    turn_pass = f"      habu::turn_pass({other});  // the other warpgroup's turn\n" if lw.pingpong else ""
    turn_start = (f"    if (cw == 1) habu::turn_pass({c(lw.turn_barrier(0))});  // warpgroup 0 issues first\n"
                  if lw.pingpong else "")
    turn_end = (f"    if (cw == 0) habu::turn_wait({c(lw.turn_barrier(0))});  // warpgroup 1's last pass (the counts balance)\n"
                if lw.pingpong else "")
    # O += P·V: bn/16 k steps, P from registers, V MN-major
    pv_mma = "\n".join(f"      {wgmma_rs_name(n_d)}(o, pa[{kk}], {_desc(lw.v_desc, lw.v_start(cx('slot'), kk))});"
                       for kk in range(bn // K_STEP))
    pv_issue = ("      habu::fence_registers(pa);\n      habu::fence_registers(o);\n      habu::wgmma_fence();\n"
                + pv_mma + "\n      habu::wgmma_commit();\n")
    p_pack = "\n".join(f"      pa[{kk}][{r}] = habu::pack_bf16x2(s[{c(lo)}], s[{c(hi)}]);"
                       for kk in range(bn // K_STEP) for r in range(4)
                       for lo, hi in [lw.p_registers(kk, r)])
    s_reg = c(lw.s_register(cx("jn"), cx("h"), cx("q")))
    o_reg = c(lw.o_register(cx("dn"), cx("h"), cx("q")))
    s_row_, s_key_ = lw.s_element(cx("cw"), cx("warp"), cx("lane"), cx("jn"), cx("h"), cx("q"))

    fold = lw.scale_in_exponent(sizes)  # the max on raw scores, P = 2^(s·c − m·c): one FFMA a score
    # the rescale 2^((m_old − m_new)·c): exactly 1 where a row's max did not move (O's rescale is then skipped)
    alpha_lines = ("  const float m_shift = habu::softmax_shift(m_new);\n  shift[h] = m_shift * scale;\n"
                   f"  alpha[h] = habu::exp2_fast({lw.rescale('m[h]', 'm_shift', ops)} * scale);" if fold else
                   "  shift[h] = habu::softmax_shift(m_new);\n"
                   f"  alpha[h] = habu::exp2_fast({lw.rescale('m[h]', 'shift[h]', ops)});")
    exponent = f"fmaf(s[{s_reg}], scale, -shift[h])" if fold else f"s[{s_reg}] - shift[h]"
    exp2 = exp2_call(k.exp_fma)

    def softmax(ind: str) -> str:
        """Tile ks's scale, mask and online softmax on S's registers (P = exp(S − m) left in place, alpha and l
        updated), at indent `ind`."""
        open_tile = c(lw.unmasked(CExpr("ks"), CExpr("open_limit"), sizes, lambda a, b: CExpr(f"({c(a)} && {c(b)})")))
        i_of = c(lw.row(CExpr("qt"), s_row_))
        j_of = c(lw.key(CExpr("ks"), s_key_))
        scaled = "" if fold else "\n        s[{s_reg}] *= scale;"
        mc, sc = k.max_chains, k.sum_chains
        max_slot = chain_slot(lw, mc, "jn", "h")
        sum_into = f"ls[{chain_slot(lw, sc, 'jn', 'h')}]" if sc > 1 else "l[h]"
        sum_decl = (f"\nfloat ls[{lw.chain_slots(sc)}] = {{{', '.join(['0.0f'] * lw.chain_slots(sc))}}};  // row half h's sums of the tile: "
                    f"8-key group jn's chain jn % {sc} at {chain_slot(lw, sc, 'jn', 'h')}" if sc > 1 else "")
        sum_join = (f"\n#pragma unroll\nfor (int h = 0; h < {lw.fragment.halves}; ++h) "
                    f"l[h] += {chain_join(lw, sc, 'ls', 'h', lambda a, b: f'({a} + {b})')};" if sc > 1 else "")
        text = f"""const bool open_tile = {open_tile};  // every key of tile ks visible to every row: no mask
float mx[{lw.chain_slots(mc)}];  // row half h's max: 8-key group jn's chain jn % {mc} at {max_slot}
#pragma unroll
for (int x = 0; x < {lw.chain_slots(mc)}; ++x) mx[x] = habu::neg_inf_f();{sum_decl}
if (open_tile) {{
#pragma unroll
  for (int jn = 0; jn < {lw.score_groups}; ++jn)
#pragma unroll
    for (int h = 0; h < {lw.fragment.halves}; ++h)
#pragma unroll
      for (int q = 0; q < {lw.fragment.pair}; ++q) {{{scaled.format(s_reg=s_reg)}
        mx[{max_slot}] = fmaxf(mx[{max_slot}], s[{s_reg}]);
      }}
}} else {{
#pragma unroll
  for (int jn = 0; jn < {lw.score_groups}; ++jn)
#pragma unroll
    for (int h = 0; h < {lw.fragment.halves}; ++h)
#pragma unroll
      for (int q = 0; q < {lw.fragment.pair}; ++q) {{  // {"mask" if fold else "scale and mask"} register (jn, h, q)
        const long long i = (long long)({i_of});
        const long long j = (long long)({j_of});
        const bool visible = {c(lw.key_inside(CExpr('j'), sizes))} && {mask};
        (void)i;
        s[{s_reg}] = visible ? s[{s_reg}]{"" if fold else " * scale"} : habu::neg_inf_f();
        mx[{max_slot}] = fmaxf(mx[{max_slot}], s[{s_reg}]);
      }}
}}
#pragma unroll
for (int h = 0; h < {lw.fragment.halves}; ++h) {{
  const float m_new = {ops.max('m[h]', f'habu::row_max_lanes<{shuffles}>({chain_join(lw, mc, "mx", "h", ops.max)})')};
{alpha_lines}
  m[h] = {lw.kept_max('m[h]', 'm_new')};
  l[h] *= alpha[h];
}}
#pragma unroll
for (int jn = 0; jn < {lw.score_groups}; ++jn)
#pragma unroll
  for (int h = 0; h < {lw.fragment.halves}; ++h)
#pragma unroll
    for (int q = 0; q < {lw.fragment.pair}; ++q) {{
      s[{s_reg}] = {exp2(exponent, 'jn')};  // a masked score: 2^−∞ = 0
      {sum_into} += s[{s_reg}];
    }}{sum_join}
"""
        return "".join(ind + line + "\n" if line else "\n" for line in text.splitlines())

    late_wait = ("      habu::end_block(l[0]);  // the wait below stays after the softmax (ptxas hoists it to its "
                 "block's top)\n" if k.late_wait else "")

    def rescale_o(ind: str) -> str:
        """O times alpha (the rescale of the tile whose P·V is issued next; no wgmma reads or writes O now),
        skipped by a warp whose every alpha is 1 (its rows' maxima unchanged: x · 1.0f is x) unless the plan rescales
        on every tile (`rescale_always`)."""
        vote = ("{  // every tile (`rescale_always`)" if k.rescale_always else
                "if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {  // a row's max moved")
        text = f"""{vote}
#pragma unroll
  for (int dn = 0; dn < {lw.out_groups}; ++dn)
#pragma unroll
    for (int h = 0; h < {lw.fragment.halves}; ++h)
#pragma unroll
      for (int q = 0; q < {lw.fragment.pair}; ++q) o[{o_reg}] *= alpha[h];  // before this tile's P·V
}}
"""
        return "".join(ind + line + "\n" for line in text.splitlines())

    def pack_p(ind: str) -> str:
        """P packed into pa (no wgmma reads pa now)."""
        return "".join(ind + line.strip() + "\n" for line in p_pack.splitlines())

    o_row, o_col = lw.o_element(cx("cw"), cx("warp"), cx("lane"), cx("dn"), cx("h"), cx("q"))
    row_of = lambda t: c(lw.row(CExpr("qt"), t))  # noqa: E731
    po = sig.pointer(lw.out.tensor, lw.out.dtype, writes=True)
    o_coord = {**batch, "i": "i", "d": "d"}
    fr = lw.fragment
    resized = split.producer != split.at_launch or split.consumer != split.at_launch
    dec = f"    habu::setmaxnreg_dec<{split.producer}>();\n" if split.producer != split.at_launch else ""
    inc = (f"    habu::setmaxnreg_inc<{split.consumer}>();  // {split.describe()}\n" if split.consumer != split.at_launch
           else f"    // {split.describe()}: no setmaxnreg\n")
    pers = lw.persistent

    def deeper(text: str, levels: int = 1) -> str:
        """`text` `levels` blocks deeper (a persistent block's per-tile code sits in its walk's loop)."""
        pad = "  " * levels
        return "".join(pad + line + "\n" if line else "\n" for line in text.splitlines())

    tile_var = CExpr("w") if pers else bx  # the work tile: a persistent block's walk, else the block
    decode = f"""  const {it} qt = ({it})({c(lw.query_tile(tile_var, sizes))});  // the query tile
  const {it} flat = ({it})({c(lw.batch_flat(tile_var, sizes))});  // the batch element
{batch_code}  const long long limit = {c(limit)};  // keys at or past this are masked for every row of the tile
  const long long tiles = habu::unfolded({c(tiles)});  // the KV tiles visited (the causal skip); a loop whatever the count
  const long long open_limit = {c(open_limit)};  // keys below this are visible to every row of the tile
  (void)limit;
  (void)open_limit;
"""
    released = ""  # the consumers' arrival on Q-empty once the tile's last S is done (persistent)
    if pers:
        released = (f"      habu::warpgroup_arrive_if({c(lw.q_released(lw.s_completed(cx('ks')), cx('tiles')))}, q_empty, "
                    "tid);  // the tile's last S is done: the next Q may land\n")
    producer_tile = f"""      habu::mbar_arrive_expect_tx(q_bar, {q_bytes});
{q_loads}
      for (long long kt = {c(first)}; kt < tiles; ++kt) {{
        habu::mbar_wait({_barrier(ring, "stage", empty=True)}, {c(ring.producer_wait(CExpr("phase")))});
        const habu::u32 full = {_barrier(ring, "stage")};
        habu::mbar_arrive_expect_tx(full, {ring.expect_tx});
{kv_loads}
        {ring_advance_line(ring)}
      }}
"""
    consumer_state = f"""    float o[{lw.o_registers}];
#pragma unroll
    for (int r = 0; r < {lw.o_registers}; ++r) o[r] = 0.0f;
    float m[2] = {{habu::neg_inf_f(), habu::neg_inf_f()}}, l[2] = {{0.0f, 0.0f}};
"""
    consumer_regs = f"""    float s[{lw.s_registers}];  // S of the tile in flight, then its P
    float alpha[2], shift[2];  // the rescale of O and l for the tile, its exponentials' shift
    habu::u32 pa[{bn // K_STEP}][4];  // P's A registers of each k step (keys 16·kk..)
    const float scale = {scale} * habu::LOG2E;  // scores in base 2: exp(x) = 2^(x·log2 e)
"""
    q_wait = (f"    habu::mbar_wait(q_bar, {c(lw.q_full_parity(cx('n')))});  // the tile's Q has landed\n"
              f"    habu::warpgroup_arrive_if({c(lw.q_released(0, cx('tiles')))}, q_empty, tid);  "
              "// a tile with no KV tile reads no Q\n" if pers else "    habu::mbar_wait(q_bar, 0);\n")
    consumer_tile = f"""{q_wait}    int slot = 0;  // the stage of the tile whose P·V is next
    if ({c(lw.visits(first, CExpr('tiles')))}) {{  // the first tile: its S, its softmax
      habu::mbar_wait({_barrier(ring, "stage")}, {c(ring.consumer_wait(CExpr("phase")))});
      slot = {c(ring.read_slot(CExpr("stage")))};
      {ring_advance_line(ring)}
{turn_wait}      habu::wgmma_fence();
{s_mma}
      habu::wgmma_commit();
{turn_pass}      habu::wgmma_wait<0>();
      habu::fence_registers(s);
      const long long ks = {c(first)};
{released}{softmax('      ')}{pack_p('      ')}    }}
    for (long long kt = {c(first)}; kt + 1 < tiles; ++kt) {{  // P(kt) in pa, alpha(kt) to rescale O; a next tile
      // S of tile kt + 1 first: O's rescale runs while it does, tile kt + 1's softmax while P(kt)·V(kt) does
      habu::mbar_wait({_barrier(ring, "stage")}, {c(ring.consumer_wait(CExpr("phase")))});
      const int nslot = {c(ring.read_slot(CExpr("stage")))};
      {ring_advance_line(ring)}
{turn_wait}      habu::wgmma_fence();
{s_mma_next}
      habu::wgmma_commit();
{rescale_o('      ')}{pv_issue}{turn_pass}      habu::wgmma_wait<1>();  // S of tile kt + 1
      habu::fence_registers(s);
      const long long ks = {bare(lw.next_tile(CExpr('kt')))};
{released}{softmax('      ')}{late_wait}      habu::wgmma_wait<0>();  // P(kt)·V(kt)
      habu::fence_registers(o);
      if (tid % 128 == 0) habu::mbar_arrive({_barrier(ring, "slot", empty=True)});  // tile kt's stage is free
{pack_p('      ')}      slot = nslot;
    }}
    if ({c(lw.visits(first, CExpr('tiles')))}) {{  // the last tile's P·V
{turn_wait}{rescale_o('      ')}{pv_issue}{turn_pass}      habu::wgmma_wait<0>();
      habu::fence_registers(o);
      if (tid % 128 == 0) habu::mbar_arrive({_barrier(ring, "slot", empty=True)});
    }}
"""
    qv = lw.out_vectors
    # a training forward's row statistics (habu/emit_cuda/attention_stats.py), before l becomes 1 / l
    stats = statistics_store(lw, sig, sizes, it, table, lw.consumer_stat_row(cx("cw"), cx("warp"), cx("lane"), cx("h")),
                             "m[h]", "l[h]", "      ")
    inverse_l = f"""#pragma unroll
    for (int h = 0; h < {lw.fragment.halves}; ++h) {{  // 1 / l once a row (0 for a row with no visible key)
      l[h] = habu::row_sum_lanes<{shuffles}>(l[h]);
{stats}      l[h] = habu::f_div0(1.0f, l[h]);
    }}
"""
    if split_on:
        epilogue = wgmma_split_epilogue(lw, sig, sizes, it, table, o_coord)
    elif qv is not None:  # 16-byte vectors: the lanes of a row trade column pairs first (habu/lower/quad_vectors.py)
        v_row = lw.o_vector_element(cx("cw"), cx("warp"), cx("lane"), 0, cx("h"), 0, 0)[0]
        epilogue = inverse_l + quad_store_rows(
            qv, lw.out.dtype, lambda g, q: f"o[{c(lw.o_register(cx(g), cx('h'), q))}] * l[h]",
            f"const {it} i = ({it})({row_of(v_row)});  // the row of the lane's row half h",
            lambda vec, n: f"if ({c(lw.row_inside(CExpr('i'), sizes))} && ({access_mask(lw.out, o_coord, sizes, table)})) "
                           f"habu::store_words<{n}>({po} + ({access_offset(lw.out, o_coord, sizes, lw.index_width, table)}), "
                           f"{vec});",
            index_type=it)
    else:
        epilogue = inverse_l + f"""#pragma unroll
    for (int dn = 0; dn < {lw.out_groups}; ++dn)
#pragma unroll
      for (int h = 0; h < {lw.fragment.halves}; ++h)
#pragma unroll
        for (int q = 0; q < {lw.fragment.pair}; ++q) {{
          const {it} i = ({it})({row_of(o_row)});
          const {it} d = ({it})({c(o_col)});
          if ({c(lw.row_inside(CExpr('i'), sizes))} && ({access_mask(lw.out, o_coord, sizes, table)}))
            {store_value(lw.out.dtype, po, access_offset(lw.out, o_coord, sizes, lw.index_width, table), f'o[{o_reg}] * l[h]')}
        }}
"""
    init = f"""  if (tid == 0) {{
    habu::ring_init(bars, {ring.stages}, {ring.full_arrivals}, {ring.empty_arrivals});
    habu::mbar_init(q_bar, 1);
{f"    habu::mbar_init(q_empty, {lw.consumers});{chr(10)}" if pers else ""}    habu::fence_barrier_init();
  }}
  __syncthreads();
  int stage = {ring.start_stage};
  habu::u32 phase = {ring.start_phase};
"""
    if pers:  # the walk: w = work_of(blockIdx.x, n, gridDim.x) for n = 0, 1, ... below the work tiles
        b, g = CExpr("(long long)blockIdx.x"), CExpr("(long long)gridDim.x")
        w0, step = c(lw.work_of(b, 0, g)), c(lw.work_of(b, CExpr("n"), g))
        walk = f"for (long long n = 0, w = {w0}; w < work; ++n, w = {step}) {{"
        head = f"""  const long long work = {c(lw.work_tiles(sizes))};  // the work tiles (query tile, batch element), heaviest first
  const habu::u32 q_empty = smem_base + {lw.q_empty}u;  // the consumers are done with Q's tile
{init}"""
        producer = f"""      {walk}  // this block's work tiles; n: those before w
{deeper(decode, 3)}        if (n > 0) habu::mbar_wait(q_empty, {c(lw.q_free_parity(cx('n')))});  // tile n − 1's Q is free
{deeper(producer_tile)}      }}
"""
        consumer = f"""{consumer_regs}{turn_start}    {walk}  // this block's work tiles; n: those before w
{deeper(decode, 2)}{deeper(consumer_state + consumer_tile + epilogue)}    }}
{turn_end}"""
    elif split_on:  # split-major blocks: the split, then the block among its split's blocks
        split_of, rest = lw.block_split(CExpr("(long long)blockIdx.x"), sizes)
        head = f"""  const long long bx = {c(rest)};  // the block among its split's blocks
  const int split = (int)({c(split_of)});  // its split: KV tiles {c(first)}..
{decode}{init}"""
        producer = producer_tile
        consumer = f"""{consumer_state}{consumer_regs}{turn_start}{consumer_tile}{turn_end}{epilogue}"""
    else:
        head = f"""  const long long bx = blockIdx.x;
{decode}{init}"""
        producer = producer_tile
        consumer = f"""{consumer_state}{consumer_regs}{turn_start}{consumer_tile}{turn_end}{epilogue}"""
    body = f"""{wgmma_function(bn, "bf16")}{wgmma_rs_function(n_d)}
extern "C" __global__ void __launch_bounds__({lw.threads}, 1) {name}(SIGNATURE) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const habu::u32 smem_base = (habu::smem_addr(smem_raw) + 1023u) & ~1023u;  // 128-byte swizzled tiles: 1024-byte aligned
  const habu::u32 bars = smem_base + {ring.base}u;  // full[s] at +{ring.barrier_stride}·s, empty[s] {ring.empty_offset} bytes after it
  const habu::u32 q_bar = smem_base + {lw.q_bar}u;  // Q's tile has landed
{GRID_LAUNCH}{GRID_WAIT}  const int tid = threadIdx.x;
  const int wg = tid / 128;
{head}  if (wg == 0) {{  // ---------------------------------------------------------------- producer
{dec}    if (tid == 0) {{
{producer}    }}
  }} else {{  // --------------------------------------------------------------------- consumers
{inc}    const int cw = {c(lw.consumer_of(CExpr("tid")))};  // query rows {64}·cw.. of the tile
    const int warp = {c(fr.thread_warp(CExpr("tid")))}, lane = {c(fr.thread_lane(CExpr("tid")))};
{consumer}  }}
}}
"""
    src = header(f"{name}: fused attention (online softmax), wgmma main loop: query tiles of {bm} rows "
                 f"({lw.consumers} consumer warpgroup(s)), KV tiles of {bn} keys in a TMA ring of {ring.stages} stages",
                 [f"computes {lw.node.target} = softmax-weighted sum over #{lw.key_extent} "
                  f"(#{lw.row_extent} queries, head widths {n_e}/{n_d})",
                  f"mask: {'none' if lw.mask is None else 'the model' + chr(39) + 's'}; causal skip: "
                  f"{'yes' if lw.skip_bound() is not None else 'no'}"])
    src += body.replace("SIGNATURE", sig.declaration())
    demand = split.demand if resized else None
    if not split_on:
        return CudaKernel(name, src, tuple(sig.params), lw.threads, lw.smem_bytes(), lw, register_demand=demand)
    return CudaKernel(name, src, tuple(sig.params), lw.threads, lw.smem_bytes(), lw, register_demand=demand,
                      zero=(lw.counter_tensor,), workspace=split_workspaces(lw), zero_once=(lw.counter_tensor,))


def _blocks(lw: AttentionWgmmaLowering, sizes, slots: int) -> tuple[int, int, int]:
    if lw.persistent:  # one block a resident slot (an SM), at most one a work tile
        return int(lw.persistent_blocks(int(lw.work_tiles(sizes)), slots)), 1, 1
    return GRID_2D.blocks(lw, sizes, slots)


def _formula(lw: AttentionWgmmaLowering, s, slots) -> tuple[object, object, object]:
    if lw.persistent:
        return cmax(1, cmin(lw.work_tiles(s), slots)), "1", "1"
    return GRID_2D.formula(lw, s, slots)


# (batch elements × query tiles, 1); persistent: the SMs (`resident_blocks`), at most the work tiles
register_geometry(AttentionWgmmaLowering, LaunchGeometry(
    blocks=_blocks, formula=_formula, slots=lambda lw, cluster: "sm_count" if lw.persistent else None))

__all__ = ["emit_attention_wgmma", "wgmma_rs_function", "wgmma_rs_name"]
