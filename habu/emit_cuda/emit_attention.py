"""Fused attention kernels (FlashAttention-2 style), printed from the `AttentionLowering`.

Block x takes its query tile and batch element (`query_tile`, `batch_flat`, `batch_coords`); its Q tile
(bm rows × #E) and then K/V tiles of bn keys reach shared memory by cp.async in 16-byte chunks (rows
padded by 16 bytes, two K/V buffers: the next tile loads while this one is multiplied; a masked chunk
is zeros). Each warp owns 16 query rows: their Q fragments are read once into registers; per KV tile it
computes S = Q·Kᵀ with mma.sync m16n8k16 (bf16, f32 accumulate), scales S, masks it (keys past #J and the
model's mask: −∞), and runs the online softmax in registers (`habu/attention/online.cuh`: the row maximum
over the lane's registers and then its row's lanes by xor shuffles, the lowering's `running_max`,
`rescale` and `kept_max`); P = exp(S − m) is packed to bf16 A fragments in registers and O += P·V with V's
B fragments by ldmatrix.x4.trans. The scores are kept in base 2 (the scale times log2 e), so each exp is one
ex2 (`habu::exp2_fast`): exp(x) = 2^(x·log2 e), a float-only step (the maxima and shifts scale with
the scores; the field check runs exp). The tiles past the causal limit (`key_limit`, `kv_tiles`) are never
loaded. At the end l is summed over the row's lanes and O / l stored (div0: a row with no visible key is 0).
"""

from __future__ import annotations

from habu.emit_cuda.attention_exp import exp2_call
from habu.emit_cuda.attention_stats import statistics_store
from habu.emit_cuda.attention_text import FloatOps, batch_lines, mask_term, no_load
from habu.emit_cuda.cexpr import CExpr, bare, c
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
from habu.emit_cuda.emit_attention_merge import merge_epilogue
from habu.emit_cuda.emit_attention_split import split_epilogue, split_workspaces
from habu.emit_cuda.emit_fma import table_reader
from habu.emit_cuda.geometry import GRID_2D, register_geometry
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.attention import AttentionLowering
from habu.spec.ir import Model


def emit_attention(name: str, model: Model, lw: AttentionLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    table = table_reader(sig, model, it)
    n_e, n_d = sizes[lw.red_extent], sizes[lw.col_extent]
    if not isinstance(n_e, int) or not isinstance(n_d, int):
        raise ValueError(f"{name}: the head widths #{lw.red_extent} and #{lw.col_extent} must be known when the "
                         "kernel is compiled")
    bm, bn, threads = k.bm, k.bn, lw.threads
    pe, pd = lw.pitch_e, lw.pitch_d
    layout = lw.smem_layout()
    smem = lw.smem_bytes()
    stage = lw.stage_elements
    cx = CExpr
    chunk_e = [c(x) for x in lw.copy_chunk(cx("chunk"), n_e)]
    chunk_d = [c(x) for x in lw.copy_chunk(cx("chunk"), n_d)]
    mi_n = lw.sets_per_warp
    rt = c(lw.row_tile(cx("warp"), cx("mi")))
    split_on = bool(k.kv_split)
    split = cx("split") if split_on else 0
    first = lw.first_tile(split)  # the block's first KV tile (split-KV: its split's)
    q_resident = mi_n == 1  # one row tile a warp: its Q fragments stay in registers; two: read per k step

    def q_loads(indent: str, step: str) -> str:
        return "\n".join(f"{indent}qf[mi][{step}][{r}] = *reinterpret_cast<const habu::u32*>(smem + "
                         f"{c(lw.q_fragment(lw.row_tile(cx('warp'), cx('mi')), cx('lane'), cx('kk'), r))});"
                         for r in range(4)) + "\n"

    if q_resident:
        q_once = ("    if (kt == " + c(first) + ") {\n#pragma unroll\n      for (int kk = 0; kk < " + str(lw.qk_steps) + "; ++kk)\n"
                  "#pragma unroll\n        for (int mi = 0; mi < 1; ++mi) {\n" + q_loads("          ", "kk")
                  + "        }\n    }\n")
        q_step = ""
    else:
        q_once = ""
        q_step = "#pragma unroll\n      for (int mi = 0; mi < " + str(mi_n) + "; ++mi) {\n" + q_loads("        ", "0") \
            + "      }\n"
    k_addr = c(lw.k_slice_rows(cx("warp"), cx("s"), cx("lane"), cx("kk"), cx("jp")))

    def packed(r: int) -> str:
        (g0, q0), (g1, q1) = lw.p_fragment(cx("kk"), r)
        return f"        pa[mi][{r}] = habu::pack_bf16x2(sc[mi][{c(g0)}][{q0}], sc[mi][{c(g1)}][{q1}]);"

    p_frag = "\n".join(packed(r) for r in range(4))
    v_addr = c(lw.v_slice_rows(cx("warp"), cx("s"), cx("lane"), cx("kk"), cx("dp")))
    fr = lw.fragment
    q_h, q_half = lw.register_parts(cx("q"))  # register q of an 8-column group: (h, column in the pair)
    s_row, s_col = fr.element(cx("rt"), cx("lane"), cx("jn"), cx("h"), q_half)
    s_elem = [c(s_row), c(lw.slice_key(cx("warp"), s_col))]  # the score's row, and its key in the tile
    o_elem = [c(x) for x in fr.element(cx("rt"), cx("lane"), cx("dn"), q_h, q_half)]
    pq, pk, pv = (sig.pointer(a.tensor, "bf16") for a in (lw.q, lw.k, lw.v))
    po = sig.pointer(lw.out.tensor, lw.out.dtype, writes=True)
    batch = {a: a for a in lw.batch_axes}
    q_coord, k_coord, v_coord = {**batch, "i": "i", "e": "e"}, {**batch, "j": "j", "e": "e"}, {**batch, "j": "j", "d": "d"}
    o_coord = {**batch, "i": "i", "d": "d"}
    bx = CExpr("bx")
    batch_code = batch_lines(lw, sizes, it)
    term = mask_term(table)

    if split_on:  # split-major blocks: split, then the block among its split's blocks
        split_of, rest = lw.block_split(CExpr("(long long)blockIdx.x"), sizes)
        block_code = (f"  const long long bx = {c(rest)};  // the block among its split's blocks\n"
                      f"  const int split = (int)({c(split_of)});  // its split: KV tiles {c(first)}..\n")
    else:
        block_code = "  const long long bx = blockIdx.x;\n"
    nxt = lw.prefetch_tile(cx('kt'))
    ahead = lw.kv_stages - 1  # the tiles in flight while one is multiplied
    limit = lw.key_limit(CExpr("(long long)qt"), sizes, term)
    open_limit = lw.open_limit(CExpr("(long long)qt"), sizes, term)
    unmasked = c(lw.unmasked(CExpr("(long long)kt"), CExpr("open_limit"), sizes, lambda a, b: CExpr(f"({c(a)} && {c(b)})")))
    tiles = lw.end_tile(split, lw.kv_tiles(CExpr(f"(long long)({c(limit)})"), sizes, lambda x, lo, hi: CExpr(
        f"min(max({c(x)}, (long long){c(lo)}), (long long)({c(hi)}))")))
    scale = "1.0f" if lw.scale is None else float_expr(lw.scale, no_load, sizes)
    mask = condition_code(lw.mask, sizes, table) if lw.mask is not None else "true"
    ops = FloatOps()
    shuffles = ", ".join(str(x) for x in lw.quad_offsets)
    fr = lw.fragment
    ne16, nd8, nb8, nb16 = lw.qk_steps, lw.out_groups, lw.score_groups, lw.pv_steps
    regs, halves = lw.registers, fr.halves
    h_q = bare(q_h)  # register q's row half, as an index
    exp2 = exp2_call(k.exp_fma)  # 2^x of a score (the SFU, or `exp_fma` groups of 8 on the FMA pipes)
    k_b = [lw.b_registers(x) for x in (0, 1)]  # ldmatrix.x4's registers of the two B fragments
    o_value = f"habu::f_div0(o[mi][dn][q], l[mi][{h_q}])"
    rows_i = c(sizes[lw.row_extent])
    keys_j = c(sizes[lw.key_extent])
    q_ok = f"{c(lw.row_inside(CExpr('i'), sizes))} && ({access_mask(lw.q, q_coord, sizes, table)})"
    k_ok = f"{c(lw.key_inside(CExpr('j'), sizes))} && ({access_mask(lw.k, k_coord, sizes, table)})"
    v_ok = f"{c(lw.key_inside(CExpr('j'), sizes))} && ({access_mask(lw.v, v_coord, sizes, table)})"
    row_of = lambda t: c(lw.row(CExpr("qt"), CExpr(t)))  # noqa: E731
    key_of = lambda t: c(lw.key(CExpr("kt"), CExpr(t)))  # noqa: E731
    # each row's sum over its lanes, then (a training forward) the row statistics, before O / l is stored
    stats = statistics_store(lw, sig, sizes, it, table, lw.stat_row(cx("rt"), cx("lane"), cx("h")),
                             "m[mi][h]", "l[mi][h]", "      ")
    sums = f"l[mi][h] = habu::row_sum_lanes<{shuffles}>(l[mi][h]);"
    sums = f"{{\n      {sums}\n{stats}    }}" if stats else sums
    if lw.kv_warps > 1:
        epilogue = merge_epilogue(lw, sig, sizes, it, table, rt, o_elem, o_coord)
    elif split_on:
        epilogue = split_epilogue(lw, sig, sizes, it, table, rt, o_elem, h_q, o_coord)
    else:
        epilogue = f"""#pragma unroll
  for (int mi = 0; mi < {mi_n}; ++mi) {{
    const int rt = {rt};
#pragma unroll
    for (int h = 0; h < {halves}; ++h) {sums}
#pragma unroll
    for (int dn = 0; dn < {nd8}; ++dn)
#pragma unroll
      for (int q = 0; q < {regs}; ++q) {{
        const {it} i = ({it})({row_of(o_elem[0])});
        const {it} d = ({it})({o_elem[1]});
        if ({c(lw.row_inside(CExpr('i'), sizes))} && ({access_mask(lw.out, o_coord, sizes, table)}))
          {store_value(lw.out.dtype, po, access_offset(lw.out, o_coord, sizes, lw.index_width, table), o_value)}
      }}
  }}
"""
    # the prologue's copies stop at the tiles visited, or (kv_ahead) at the block's tiles within #J: no read first
    pro_limit = c(lw.prologue_limit(split, CExpr("tiles"), sizes))
    if ahead == 1:
        prologue = (f"  if ({pro_limit} > {c(first)}) load_kv({c(first)}, {c(lw.stage_of(first))});\n"
                    "  habu::cp_async_commit();\n")
        prefetch = f"""    if ({bare(nxt)} < tiles) {{
      load_kv({bare(nxt)}, (int)({c(lw.stage_of(nxt))}));  // the next tile, into the other buffer
      habu::cp_async_commit();
      habu::cp_async_wait<1>();
    }} else {{
      habu::cp_async_wait<0>();
    }}
"""
    else:  # one commit group a tile (empty past the last): tile kt's group is complete when `ahead` are pending
        pro = lw.prologue_tile(CExpr(f"({it})({c(first)})"), cx("p"))
        prologue = f"""  for (int p = 0; p < {ahead}; ++p) {{  // the first {ahead} KV tiles, one commit group each
    if ({bare(pro)} < {pro_limit}) load_kv({bare(pro)}, (int)({c(lw.stage_of(pro))}));
    habu::cp_async_commit();
  }}
"""
        prefetch = f"""    if ({bare(nxt)} < tiles) load_kv({bare(nxt)}, (int)({c(lw.stage_of(nxt))}));  // {ahead} tiles ahead
    habu::cp_async_commit();
    habu::cp_async_wait<{ahead}>();  // tile kt's copies are done
"""
    src_body = f"""extern "C" __global__ void __launch_bounds__({threads}, 1) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  extern __shared__ __align__(16) habu::bf16 smem[];
  // Q's tile at smem + {layout['Qs'][0]} ({bm} rows × {pe}); buffer s of K ({bn} keys × {pe}) at smem + {layout['Ks0'][0]} + s·{stage},
  // of V ({bn} keys × {pd}) at smem + {layout['Vs0'][0]} + s·{stage}
  const int tid = threadIdx.x, warp = {c(fr.thread_warp(CExpr('tid')))}, lane = {c(fr.thread_lane(CExpr('tid')))};
{block_code}  const {it} qt = ({it})({c(lw.query_tile(bx, sizes))});  // the query tile
  const {it} flat = ({it})({c(lw.batch_flat(bx, sizes))});  // the batch element
{batch_code}  for (int chunk = tid; chunk < {lw.copy_chunks(bm, n_e)}; chunk += {threads}) {{  // Q: 16-byte chunks of its rows
    const int t = {chunk_e[0]}, ee = {chunk_e[1]};
    const {it} i = ({it})({row_of('t')});
    const {it} e = ({it}){c(lw.staged_column(cx('ee')))};
    const bool ok = {q_ok};
    habu::cp_async<16>(habu::smem_addr(smem + {c(lw.q_smem(cx('t'), cx('ee')))}), ok ? (const void*)({pq} + ({access_offset(lw.q, q_coord, sizes, lw.index_width, table)})) : (const void*){pq}, ok);
  }}
  habu::cp_async_commit();
  const long long limit = {c(limit)};  // keys at or past this are masked for every row of the tile
  const {it} tiles = ({it})({c(tiles)});  // the KV tiles visited (the causal skip)
  const long long open_limit = {c(open_limit)};  // keys below this are visible to every row of the tile
  (void)limit;
  (void)open_limit;
  auto load_kv = [&]({it} kt, int s) {{
    for (int chunk = tid; chunk < {lw.copy_chunks(bn, n_e)}; chunk += {threads}) {{  // K: 16-byte chunks of its rows
      const int t = {chunk_e[0]}, ee = {chunk_e[1]};
      const {it} j = ({it})({key_of('t')});
      const {it} e = ({it}){c(lw.staged_column(cx('ee')))};
      const bool ok = {k_ok};
      habu::cp_async<16>(habu::smem_addr(smem + {c(lw.k_smem(cx('s'), cx('t'), cx('ee')))}), ok ? (const void*)({pk} + ({access_offset(lw.k, k_coord, sizes, lw.index_width, table)})) : (const void*){pk}, ok);
    }}
    for (int chunk = tid; chunk < {lw.copy_chunks(bn, n_d)}; chunk += {threads}) {{  // V: 16-byte chunks of its rows
      const int t = {chunk_d[0]}, dd = {chunk_d[1]};
      const {it} j = ({it})({key_of('t')});
      const {it} d = ({it}){c(lw.staged_column(cx('dd')))};
      const bool ok = {v_ok};
      habu::cp_async<16>(habu::smem_addr(smem + {c(lw.v_smem(cx('s'), cx('t'), cx('dd')))}), ok ? (const void*)({pv} + ({access_offset(lw.v, v_coord, sizes, lw.index_width, table)})) : (const void*){pv}, ok);
    }}
  }};
{prologue}  // this warp's {mi_n} row tile(s) of 16 query rows: row tile {rt}
  habu::u32 qf[{mi_n}][{ne16 if q_resident else 1}][4];  // Q's A fragments{' (read once)' if q_resident else ' (read per step)'}
  float o[{mi_n}][{nd8}][4];
  float m[{mi_n}][2], l[{mi_n}][2];
#pragma unroll
  for (int mi = 0; mi < {mi_n}; ++mi) {{
    m[mi][0] = m[mi][1] = habu::neg_inf_f();
    l[mi][0] = l[mi][1] = 0.0f;
#pragma unroll
    for (int dn = 0; dn < {nd8}; ++dn)
#pragma unroll
      for (int q = 0; q < {regs}; ++q) o[mi][dn][q] = 0.0f;
  }}
  const float scale = {scale} * habu::LOG2E;  // scores in base 2: exp(x) = 2^(x·log2 e)
  for ({it} kt = {c(first)}; kt < tiles; ++kt) {{
    const int s = (int)({c(lw.stage_of(cx('kt')))});  // this tile's buffer
{prefetch}    __syncthreads();
{q_once}    float sc[{mi_n}][{nb8}][4];
#pragma unroll
    for (int mi = 0; mi < {mi_n}; ++mi)
#pragma unroll
      for (int jn = 0; jn < {nb8}; ++jn)
#pragma unroll
        for (int q = 0; q < {regs}; ++q) sc[mi][jn][q] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < {ne16}; ++kk) {{
{q_step}#pragma unroll
      for (int jp = 0; jp < {lw.key_pairs}; ++jp) {{  // K's B fragments of keys 16·jp.. by ldmatrix.x4, for every row tile
        habu::u32 kb[4];
        habu::ldmatrix_x4(kb, habu::smem_addr(smem + {k_addr}));
        const habu::u32 b0[2] = {{kb[{k_b[0][0]}], kb[{k_b[0][1]}]}}, b1[2] = {{kb[{k_b[1][0]}], kb[{k_b[1][1]}]}};
#pragma unroll
        for (int mi = 0; mi < {mi_n}; ++mi) {{
          habu::mma_bf16_16816(sc[mi][2 * jp], qf[mi][{'kk' if q_resident else '0'}], b0);
          habu::mma_bf16_16816(sc[mi][2 * jp + 1], qf[mi][{'kk' if q_resident else '0'}], b1);
        }}
      }}
    }}
    const bool open_tile = {unmasked};  // every key of the tile visible to every row: no mask
    float alpha[{mi_n}][2], shift[{mi_n}][2];
#pragma unroll
    for (int mi = 0; mi < {mi_n}; ++mi) {{
      const int rt = {rt};
      float mx[2] = {{habu::neg_inf_f(), habu::neg_inf_f()}};
      if (open_tile) {{
#pragma unroll
        for (int jn = 0; jn < {nb8}; ++jn)
#pragma unroll
          for (int q = 0; q < {regs}; ++q) {{
            sc[mi][jn][q] *= scale;
            mx[{h_q}] = fmaxf(mx[{h_q}], sc[mi][jn][q]);
          }}
      }} else {{
#pragma unroll
        for (int jn = 0; jn < {nb8}; ++jn)
#pragma unroll
          for (int q = 0; q < {regs}; ++q) {{  // scale and mask: register (jn, h = q / 2, q % 2)
            const int h = {h_q};
            const long long i = (long long)({row_of(s_elem[0])});
            const long long j = (long long)({key_of(s_elem[1])});
            const bool visible = {c(lw.key_inside(CExpr('j'), sizes))} && {mask};
            (void)i;
            sc[mi][jn][q] = visible ? sc[mi][jn][q] * scale : habu::neg_inf_f();
            mx[h] = fmaxf(mx[h], sc[mi][jn][q]);
          }}
      }}
      (void)rt;
#pragma unroll
      for (int h = 0; h < {halves}; ++h) {{
        const float m_new = {ops.max('m[mi][h]', f'habu::row_max_lanes<{shuffles}>(mx[h])')};
        shift[mi][h] = habu::softmax_shift(m_new);
        alpha[mi][h] = habu::exp2_fast({lw.rescale('m[mi][h]', 'shift[mi][h]', ops)});
        m[mi][h] = {lw.kept_max('m[mi][h]', 'm_new')};
        l[mi][h] *= alpha[mi][h];
      }}
#pragma unroll
      for (int dn = 0; dn < {nd8}; ++dn)
#pragma unroll
        for (int q = 0; q < {regs}; ++q) o[mi][dn][q] *= alpha[mi][{h_q}];
#pragma unroll
      for (int jn = 0; jn < {nb8}; ++jn)
#pragma unroll
        for (int q = 0; q < {regs}; ++q) {{
          sc[mi][jn][q] = {exp2(f'sc[mi][jn][q] - shift[mi][{h_q}]', 'jn')};  // a masked score: 2^−∞ = 0
          l[mi][{h_q}] += sc[mi][jn][q];
        }}
    }}
#pragma unroll
    for (int kk = 0; kk < {nb16}; ++kk) {{  // P's A fragment of keys 16·kk..: the accumulators of 8-key groups 2kk, 2kk+1
      habu::u32 pa[{mi_n}][4];
#pragma unroll
      for (int mi = 0; mi < {mi_n}; ++mi) {{
{p_frag}
      }}
#pragma unroll
      for (int dp = 0; dp < {lw.value_pairs}; ++dp) {{  // V's B fragments of columns 16·dp.. by ldmatrix.x4.trans, for every row tile
        habu::u32 vb[4];
        habu::ldmatrix_x4_trans(vb, habu::smem_addr(smem + {v_addr}));
        const habu::u32 v0[2] = {{vb[{k_b[0][0]}], vb[{k_b[0][1]}]}}, v1[2] = {{vb[{k_b[1][0]}], vb[{k_b[1][1]}]}};
#pragma unroll
        for (int mi = 0; mi < {mi_n}; ++mi) {{
          habu::mma_bf16_16816(o[mi][2 * dp], pa[mi], v0);
          habu::mma_bf16_16816(o[mi][2 * dp + 1], pa[mi], v1);
        }}
      }}
    }}
    __syncthreads();  // the next iteration's copies overwrite this buffer
  }}
  habu::cp_async_wait<0>();
{epilogue}}}
"""
    src = header(f"{name}: fused attention (online softmax), query tiles of {bm} rows ({lw.warps} warps × {16 * k.warp_m}"
                 + (f", each {lw.slice_keys} keys of a tile" if lw.kv_warps > 1 else "") + "), "
                 f"KV tiles of {bn} keys, mma.sync m16n8k16 bf16" + (f", split-KV: {k.kv_split} keys a block" if split_on else ""),
                 [f"computes {lw.node.target} = softmax-weighted sum over #{lw.key_extent} "
                  f"(#{lw.row_extent} queries, head widths {n_e}/{n_d})",
                  f"mask: {'none' if lw.mask is None else 'the model' + chr(39) + 's'}; causal skip: "
                  f"{'yes' if lw.skip_bound() is not None else 'no'}; {rows_i} rows, {keys_j} keys"])
    src += src_body.replace("SIGNATURE", sig.declaration())
    if not split_on:
        return CudaKernel(name, src, tuple(sig.params), threads, smem, lw)
    ws = split_workspaces(lw)
    return CudaKernel(name, src, tuple(sig.params), threads, smem, lw, zero=(lw.counter_tensor,), workspace=ws,
                      zero_once=(lw.counter_tensor,))


register_geometry(AttentionLowering, GRID_2D)  # (batch elements × query tiles, 1)
