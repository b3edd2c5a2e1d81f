"""The grouped GEMM's wgmma main loop (habu/lower/grouped_wgmma.py): `T[r n] = scale · Σ k A[IX[r] k] · W[E[r] n k]`
with a producer warpgroup filling an mbarrier ring (W[g]'s box by TMA, A's gathered rows by cp.async) and
consumer warpgroups multiplying with wgmma.

Printed from the `GroupedLowering` and its `WgmmaMainLoop`: every block finds the group offsets and the
row tiles' prefix sum in shared memory (`habu::group_offsets`, `habu::group_tile_starts`, as the
mma.sync loop does), takes its tile (`tile_of`, then the group by `decode`), and a block past the last
row tile returns. The stage tiles, their offsets, the descriptors and the ring's barriers, arrivals,
parities and bytes are the contraction path's (`WgmmaOperands`, `MbarrierRing`); W's box origin is
`w_box_origin`, A's rows the grouped lowering's `row` masked by `row_inside` at the group's end.
The epilogue stores each accumulator pair where its row lies in the group and its column below #N,
multiplied by P[r] (a row factor) and added with f32 atomicAdd (a scatter) where the lowering says.
"""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import (
    GRID_LAUNCH,
    GRID_WAIT,
    Signature,
    access_mask,
    access_offset,
    float_expr,
    header,
    index_code,
    index_type,
    load_value,
    store_value,
)
from habu.emit_cuda.emit_fma import table_reader
from habu.emit_cuda.emit_wgmma import ring_advance_line, ring_barrier
from habu.emit_cuda.kernel import CudaKernel, TmaSpec
from habu.emit_cuda.quad_store import quad_store_rows
from habu.emit_cuda.wgmma import wgmma_function, wgmma_name
from habu.lower.general import Store
from habu.lower.grouped import GroupedLowering
from habu.lower.grouped_wgmma import wgmma_refusal
from habu.spec.ir import Model


def no_load(ld) -> str:
    raise ValueError("the scale of a grouped kernel reads no tensor")


def desc_text(d, base: str, start) -> str:
    """A wgmma descriptor of the lowering's (`WgmmaDescriptor`) at stage tile `base` plus the start `(row part,
    k part)` the lowering gives, as C."""
    row, k_part = start
    at = base + (f" + (habu::u32)({c(row)})" if not (isinstance(row, int) and row == 0) else "")
    return f"habu::wgmma_desc<{d.lbo}u, {d.sbo}u, {d.mode}u>({at} + {c(k_part)})"


def _cp_async_fill(it: str, i_at: str, k_at: str, copies: int, kmask: str, pa: str, koff: str, loop,
                   raw_f32: bool = False) -> str:
    """Each producer thread cp.asyncs one column of its rows (its j-th row `i_at`, its k `k_at` within the k tile),
    zeros where masked: a bf16 A's 16 bytes into the stage's A tile, or (`raw_f32`, an f32 A the consumers split:
    `a_convert`) its 8 floats raw, two 16-byte halves, where the lowering stages them (`a_landed_offset`)."""
    if raw_f32:
        ctype, halves = "float", (0, 1)
        dst = {h: c(loop.a_landed_offset(CExpr("i"), CExpr(k_at), h)) for h in halves}
    else:
        ctype, halves = "habu::bf16", (0,)
        dst = {0: c(loop.operands.a_copy.byte_offset(CExpr("(habu::u32)i"), CExpr(f"(habu::u32){k_at}")))}
    lines = "\n".join(f"          habu::cp_async<16>(a_stage + (habu::u32)({dst[h]}), "
                       f"{'src' if h == 0 and not raw_f32 else f'ok ? src + {c(loop.half_source(h))} : {pa}'}, ok);"
                       for h in halves)
    return f"""      {{
        const {it} kk = k0 + {k_at};
        const bool k_ok = {kmask};
#pragma unroll
        for (int j = 0; j < {copies}; ++j) {{
          const int i = {i_at};
          const bool ok = a_row_off[j] >= 0 && k_ok;
          const {ctype}* src = ok ? {pa} + a_row_off[j] + ({koff}) : {pa};
{lines}
        }}
      }}
"""


def split_pass(loop, ind: str = "  ") -> str:
    """The consumers' in-place split of their slabs of a raw f32 A (`WgmmaMainLoop.a_convert`), as k-loop lines
    after the stage's wait: each thread reads its chunks' raw halves (`convert_source`, `a_staged_offset`), the
    warpgroup meets, each writes its chunks' bf16 parts (hi at the stage tile's slot, lo `lo_offset` after it),
    then fences them for wgmma and meets again (`habu::slab_pass_sync`, the warpgroup's named barrier)."""
    ops = loop.operands
    n = loop.convert_chunks()
    ri, ki = loop.convert_source(CExpr("ctid"), CExpr("j"))
    i = ops.slab_row(CExpr("cw"), CExpr("q")) + ri
    dst = ops.a_copy.byte_offset(i, ki)
    return f"""#pragma unroll
{ind}for (int q = 0; q < {ops.slabs}; ++q) {{  // A's slab q of this warpgroup, split in place: row {c(ri)} of the slab, 8 k from {c(ki)}
{ind}  float4 cx[{n}], cy[{n}];
#pragma unroll
{ind}  for (int j = 0; j < {n}; ++j) {{
{ind}    cx[j] = habu::load_shared_f32x4(a_stage + (habu::u32)({c(loop.a_staged_offset(i, ki, 0))}));
{ind}    cy[j] = habu::load_shared_f32x4(a_stage + (habu::u32)({c(loop.a_staged_offset(i, ki, 1))}));
{ind}  }}
{ind}  habu::slab_pass_sync(1 + cw);  // every raw chunk read before a part lands on it
#pragma unroll
{ind}  for (int j = 0; j < {n}; ++j) {{
{ind}    const habu::u32 at = a_stage + (habu::u32)({c(dst)});
{ind}    habu::store_split_bf16x8(at, at + {loop.lo_offset}u, cx[j], cy[j]);
{ind}  }}
{ind}}}
{ind}habu::fence_proxy_async();
{ind}habu::slab_pass_sync(1 + cw);  // the warpgroup's parts written and visible to its wgmmas
"""


def _f32_load(it: str, k_at: str, copies: int, kmask: str, pa: str, koff: str, k_tile: str, into: str) -> str:
    """An f32 A: each producer thread loads the same 8 k of its rows of k tile `k_tile` (two float4 each, zero
    where masked) into registers `into`x, `into`y."""
    return f"""        {{
          const {it} kk = ({it})({k_tile}) + {k_at};
          const bool k_ok = {kmask};
#pragma unroll
          for (int j = 0; j < {copies}; ++j) {{
            {into}x[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f), {into}y[j] = {into}x[j];
            if (a_row_off[j] >= 0 && k_ok) {{
              const float4* src = reinterpret_cast<const float4*>({pa} + a_row_off[j] + ({koff}));
              {into}x[j] = src[0];
              {into}y[j] = src[1];
            }}
          }}
        }}
"""


def _f32_store(i_at: str, copies: int, dst: str, lo_offset: int) -> str:
    """An f32 A: the loaded values' bf16 parts (habu::split_bf16x8) into the stage's hi and lo tiles."""
    return f"""#pragma unroll
      for (int j = 0; j < {copies}; ++j) {{
        const int i = {i_at};
        const habu::u32 at = a_stage + (habu::u32)({dst});
        habu::store_split_bf16x8(at, at + {lo_offset}u, ax[j], ay[j]);
      }}
"""


def _quad_epilogue(lw: GroupedLowering, sig: Signature, sizes, table, it: str, row, inside: str, row_factor: str,
                   value, p_out: str) -> str:
    """The 4-wide epilogue (`GroupedLowering.epilogue_quads`): per 8-column group j, each lane sends its partner
    (`quad_partner`) the pair of the row half the partner keeps (`quad_kept_half`) by one shuffle, then stores
    (or adds) the four adjacent columns of its own row (`quad_column`; the pairs at `quad_slot` of their owner)
    as one 16-byte vector where all four are inside and aligned, else element by element."""
    loop, ops = lw.wgmma, lw.wgmma.operands  # type: ignore[union-attr]
    frag = loop.fragment  # type: ignore[union-attr]
    lane = CExpr("lane")
    at = {i: {"r": "r", "n": f"col{i}"} for i in range(4)}
    masks = {i: access_mask(lw.out, at[i], sizes, table) for i in range(4)}
    offs = {i: access_offset(lw.out, at[i], sizes, lw.index_width, table) for i in range(4)}
    vals = [value(f"x{i}") for i in range(4)]
    if lw.store is Store.ATOMIC_ADD:
        one = {i: f"atomicAdd({p_out} + ({offs[i]}), {vals[i]});" for i in range(4)}
        four = f"atomicAdd(reinterpret_cast<float4*>({p_out} + ({offs[0]})), make_float4({', '.join(vals)}));"
    else:
        one = {i: f"{p_out}[{offs[i]}] = {vals[i]};" for i in range(4)}
        four = f"*reinterpret_cast<float4*>({p_out} + ({offs[0]})) = make_float4({', '.join(vals)});"
    reg = lambda h, q: f"acc[s][{2 * frag.pair} * j + {frag.pair * h + q}]"  # noqa: E731
    slot_own = [c(loop.quad_slot(lane, q)) for q in range(frag.pair)]  # type: ignore[union-attr]
    slot_got = [c(loop.quad_slot(CExpr("partner"), q)) for q in range(frag.pair)]  # type: ignore[union-attr]
    placed = "\n".join(
        f"          const float x{i} = ({slot_own[i % 2]}) == {i} ? own{i % 2} : ({slot_got[i % 2]}) == {i} ? got{i % 2} "
        ": 0.0f;" for i in range(4))
    inside_all = " && ".join(f"in{i}" for i in range(4))
    return f"""      const int partner = {c(loop.quad_partner(lane))};  // the lane this one trades pairs with
      const int h = {c(loop.quad_kept_half(lane))};  // the row half this lane stores (the other goes to its partner)
      const int sent = {c(loop.quad_kept_half(CExpr("partner")))};  // the half its partner keeps
#pragma unroll
      for (int s = 0; s < {ops.slabs}; ++s) {{
        const int ti = {c(ops.slab_row(CExpr("cw"), CExpr("s")))} + {frag.row_in_warpgroup()};
        const {it} r = ({it})({row("ti")});
{row_factor}#pragma unroll
        for (int j = 0; j < {loop.column_groups()}; ++j) {{  // four adjacent columns of row r
          const float own0 = h ? {reg(1, 0)} : {reg(0, 0)}, own1 = h ? {reg(1, 1)} : {reg(0, 1)};
          const float got0 = __shfl_sync(0xffffffffu, sent ? {reg(1, 0)} : {reg(0, 0)}, partner);
          const float got1 = __shfl_sync(0xffffffffu, sent ? {reg(1, 1)} : {reg(0, 1)}, partner);
{placed}
          const {it} col0 = ({it})({c(lw.column(CExpr("nt"), loop.quad_column(lane, CExpr("j"))))});
          const {it} col1 = col0 + 1, col2 = col0 + 2, col3 = col0 + 3;
          const bool {", ".join(f"in{i} = {inside} && ({masks[i]})" for i in range(4))};
          if ({inside_all} && (({offs[0]}) & 3) == 0) {{
            {four}
          }} else {{
{chr(10).join(f"            if (in{i}) {one[i]}" for i in range(4))}
          }}
        }}
      }}
"""


def _vector_epilogue(lw: GroupedLowering, sizes, table, it: str, row, inside: str, row_factor: str, value,
                     p_out: str, second: str) -> str:
    """The 16-byte epilogue (`GroupedLowering.epilogue_vectors`, habu/lower/quad_vectors.py): per slab and row
    half, each lane's column pairs (the node of both, for a pair: its products' groups at `pair_group`) packed
    into words, traded among the row's lanes, and stored as one vector of 8 columns where every column is
    inside and the offset aligned, else the columns inside one at a time."""
    loop, qv = lw.wgmma, lw.epilogue_vectors
    assert loop is not None and qv is not None
    frag, ops = loop.fragment, loop.operands
    n = qv.elements
    reg = lambda which, g, q: c(frag.register_index(loop.pair_group(CExpr(g), which), CExpr("h"), q))  # noqa: E731
    if lw.pair is None:
        of = lambda g, q: value(f"acc[s][{reg(0, g, q)}]")  # noqa: E731
    else:
        of = lambda g, q: value(f"acc[s][{reg(0, g, q)}]", f"{second}[s][{reg(1, g, q)}]")  # noqa: E731
    at = {e: {"r": "r", "n": f"(col0 + {e})"} for e in range(n)}
    masks = [access_mask(lw.out, at[e], sizes, table) for e in range(n)]
    offs = [access_offset(lw.out, at[e], sizes, lw.index_width, table) for e in range(n)]
    ins = " && ".join(f"({m})" for m in masks)
    each = " ".join(f"if ({masks[e]}) {p_out}[{offs[e]}] = habu::word_half(vec, {e});" for e in range(n))
    vrow = c(qv.row(CExpr("warp"), CExpr("lane"), CExpr("h")))
    row_code = (f"const int ti = {c(ops.slab_row(CExpr('cw'), CExpr('s')))} + {vrow};  // the lane's row of half h\n"
                f"const {it} r = ({it})({row('ti')});\n" + row_factor)

    def store(vec: str, words: int) -> str:
        return (f"const {it} col0 = ({it})({c(lw.column(CExpr('nt'), CExpr('d')))});  // the vector's first column\n"
                f"    if ({inside}) {{\n"
                f"      if (({ins}) && (({offs[0]}) & {n - 1}) == 0) habu::store_words<{words}>({p_out} + ({offs[0]}), {vec});\n"
                f"      else {{ {each} }}  // an edge or an unaligned row: the columns inside\n"
                f"    }}")

    loops = quad_store_rows(qv, lw.out.dtype, of, row_code, store, ind="        ", index_type=it)
    return f"""#pragma unroll
      for (int s = 0; s < {ops.slabs}; ++s) {{  // slab s: {qv.sets} vectors of {n} columns a row half
{loops}      }}
"""


def consumer_k_loop(ring, ops, mma: str, ind: str, before_wait: str = "", after_wait: str = "") -> str:
    """A consumer warpgroup's k loop over `k_tiles` stages of the ring (the lowering's `MbarrierRing` and
    `WgmmaOperands`): wait for the stage's `full` phase, issue `mma` (the wgmma lines of a k step `kk`), keep one
    group in flight, release the stage read before; then drain and release the last. Each line indented by `ind`;
    `before_wait` and `after_wait` (lines at the loop body's indent) go before the stage's wait and after it,
    before the wgmmas (the weight gradient's in-place pass over its staged A)."""
    slot = c(ring.read_slot(CExpr("stage")))
    release = f"if (held >= 0 && tid % 128 == 0) habu::mbar_arrive({ring_barrier(ring, 'held', empty=True)});"
    lines = f"""int held = -1;  // the stage whose wgmma may still be reading it
for (long long kt = 0; kt < k_tiles; ++kt) {{
{before_wait}  habu::mbar_wait({ring_barrier(ring, "stage")}, {c(ring.consumer_wait(CExpr("phase")))});
  const habu::u32 a_stage = smem_base + {ops.stage_tile("A", 0)}u + (habu::u32)({slot}) * {ops.stage_stride}u;
  const habu::u32 b_stage = smem_base + {ops.stage_tile("B", 0)}u + (habu::u32)({slot}) * {ops.stage_stride}u;
{after_wait}  habu::wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < {ops.k_steps}; ++kk) {{
MMA
  }}
  habu::wgmma_commit();
  habu::wgmma_wait<1>();
  {release}
  held = {slot};
  {ring_advance_line(ring)}
}}
habu::wgmma_wait<0>();
{release}
"""
    out = "".join(line if line.startswith("#") or line.rstrip("\n") == "MMA" else ind + line
                  for line in lines.splitlines(keepends=True))
    return out.replace("MMA", mma)


def kernel_opening(name: str, threads: int, ops, ring, it: str, groups: int, rows: str) -> str:
    """A grouped wgmma kernel's first lines (both forms): the entry point, the stage tiles' aligned base, the ring's
    barriers and the block's offs[] of the groups' first rows."""
    return f"""extern "C" __global__ void __launch_bounds__({threads}, 1) {name}(SIGNATURE) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const habu::u32 raw_base = habu::smem_addr(smem_raw);
  const habu::u32 smem_base = (raw_base + {ops.base_align - 1}u) & ~{ops.base_align - 1}u;  // 128-byte swizzled tiles need 1024-byte alignment
  const habu::u32 bars = smem_base + {ring.base};
  __shared__ {it} offs[{groups + 1}];  // offs[g]: the first row of group g (offs[{groups}] = #{rows})
"""


def emit_grouped_wgmma(name: str, model: Model, lw: GroupedLowering, static: dict[str, int]) -> CudaKernel:
    k, loop = lw.kernel, lw.wgmma
    refused = wgmma_refusal(k, lw.a.dtype, lw.w.dtype, lw.pair is not None, lw.w_n_major)
    if refused or loop is None:
        raise ValueError(f"{name}: {refused or 'the wgmma main loop has no stage maps for this tile'}")
    ops, ring = loop.operands, loop.ring
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    table = table_reader(sig, model, it)
    groups = sizes[lw.g]
    if not isinstance(groups, int):
        raise ValueError(f"{name}: the number of groups #{lw.g} must be known when the kernel is compiled")
    bm, bn, bk = k.bm, k.bn, ops.bk
    e_ptr = sig.pointer(lw.groups, model.tensor(lw.groups).dtype.name)  # type: ignore[union-attr]
    w_map = sig.tensormap(TmaSpec(lw.w.tensor, lw.w.dtype, tuple(reversed(lw.w.bounded_extents())),
                                  loop.w_box(lw.w), ops.b_tile.swizzle))
    pair = lw.pair
    w2_map = sig.tensormap(TmaSpec(pair.w.tensor, pair.w.dtype, tuple(reversed(pair.w.bounded_extents())),
                                   loop.w_box(pair.w), ops.b_tile.swizzle)) if pair is not None else ""
    pa = sig.pointer(lw.a.tensor, lw.a.dtype)
    p_out = sig.pointer(lw.out.tensor, lw.out.dtype, writes=True)
    rows = c(sizes[lw.r])
    gx, gy = (c(x) for x in lw.grid(sizes))
    lin = CExpr("lin")  # the persistent loop's tile index (`tile_of`)
    mt_x, nt_x = loop.tile_of(lin, CExpr("gx"), CExpr("gy"))
    row = lambda i: c(lw.row(CExpr("offs[g]"), CExpr("m"), CExpr(i)))  # noqa: E731
    inside = c(lw.row_inside(CExpr("r"), CExpr("end")))
    # A's producer copies: each thread the same 16-byte column of bm/16 rows (row offsets once per tile)
    copies = loop.producer_copies()
    i_at, k_at = c(loop.a_copy_row(CExpr("ptid"), CExpr("j"))), c(loop.a_copy_k(CExpr("ptid")))
    a_coord = {"r": "r", "k": "kk"}
    roff = access_offset(lw.a, {"r": "r", "k": "0"}, sizes, lw.index_width, table, ("r",))
    rmask = access_mask(lw.a.along("r"), {"r": "r"}, sizes, table)  # the gather's index check too
    koff = access_offset(lw.a, a_coord, sizes, lw.index_width, table, ("k",))
    kmask = access_mask(lw.a.along("k"), {"k": "kk"}, sizes, table)
    dst = c(ops.a_copy.byte_offset(CExpr("(habu::u32)i"), CExpr(f"(habu::u32){k_at}")))
    k0 = c(lw.k_index(CExpr("kt"), 0))
    def w_box(j: int) -> str:
        """W[g]'s box j of the k tile (one for a k-major W; an n-major W's 64-column boxes), where it lands."""
        at = loop.w_box_landing(j)
        coords = ", ".join(f"(int)({c(x)})" for x in loop.w_box_coordinates(lw.w, CExpr("g"), CExpr("n0"), CExpr("k0"), j))
        return (f"habu::tma_load_{len(lw.w.positions)}d(b_stage{f' + {at}u' if at else ''}, &{w_map}, full, {coords});"
                f"  // W[g]'s box{f' {j}' if loop.w_boxes > 1 else ''}: zero past #{lw.k}, #{lw.n}")

    tma = "\n          ".join(w_box(j) for j in range(loop.w_boxes))
    if pair is not None:  # the second weights' box, the same origin, after the first in the stage's B tile
        box2 = ", ".join(f"(int)({c(x)})" for x in loop.w_box_coordinates(pair.w, CExpr("g"), CExpr("n0"), CExpr("k0")))
        tma += (f"\n          habu::tma_load_{len(pair.w.positions)}d(b_stage + {loop.b2_offset}u, &{w2_map}, full, "
                f"{box2});  // {pair.w.tensor}[g]'s box, for {pair.second}")
    # the consumers' descriptors (the lowering's: WgmmaOperands.a_start / b_start)
    slabs = ops.slabs
    b_desc = desc_text(ops.b_desc, "b_stage", ops.b_start(CExpr("kk")))
    parts = (("a_stage", ""),) if loop.a_parts == 1 else \
        (("a_stage", ""), (f"a_stage + {loop.lo_offset}u", "  // A's low parts, times the same W"))
    mn = loop.mma_columns  # n of each instruction (a pair by one instruction: both boxes, 2·bn)
    both = "  // both weights' boxes: the first's columns, then the second's" if loop.one_pair_instruction else ""
    # the instruction's transpose bits: the lowering's descriptors' (an n-major W's 64-column blocks, MN-major)
    trans = (ops.b_desc.mn_major, ops.a_desc.mn_major)
    mma = "\n".join(f"          {wgmma_name(mn, 'bf16', *trans)}(acc[{s}], "
                    f"{desc_text(ops.a_desc, base, ops.a_start(CExpr('cw'), s, CExpr('kk')))}, {b_desc}, 1);{note}{both}"
                    for s in range(slabs) for base, note in parts)
    acc2 = ""
    if pair is not None and not loop.one_pair_instruction:  # the same A slabs times the second weights
        b2_desc = desc_text(ops.b_desc, f"b_stage + {loop.second_b_start()}u", ops.b_start(CExpr("kk")))
        mma += "\n" + "\n".join(
            f"          {wgmma_name(bn, 'bf16', *trans)}(acc2[{s}], "
            f"{desc_text(ops.a_desc, 'a_stage', ops.a_start(CExpr('cw'), s, CExpr('kk')))}, {b2_desc}, 1);  // {pair.second}"
            for s in range(slabs))
        acc2 = f"""      float acc2[{{slabs}}][{{regs}}];  // {pair.second}
#pragma unroll
      for (int s = 0; s < {{slabs}}; ++s)
#pragma unroll
        for (int i = 0; i < {{regs}}; ++i) acc2[s][i] = 0.0f;
"""
    frag = loop.fragment
    regs = frag.registers(loop.accumulator_groups())
    split = loop.registers
    assert split is not None
    if loop.a_parts == 1:
        a_pre, a_load, a_fill, arrive = "", "", _cp_async_fill(it, i_at, k_at, copies, kmask, pa, koff, loop), \
            "habu::cp_async_arrive(full);"
    elif loop.a_convert:  # an f32 A copied raw, every stage of the ring in flight; the consumers split it
        a_pre, a_load, a_fill, arrive = "", "", _cp_async_fill(it, i_at, k_at, copies, kmask, pa, koff, loop, True), \
            "habu::cp_async_arrive(full);"
    else:  # an f32 A: the k tile's rows loaded before the stage is free, split into bf16 parts, stored
        # the next k tile's loads are in flight while this one's parts are stored (two tiles of registers)
        first_k, next_k = c(lw.k_index(0, 0)), c(lw.k_index(CExpr("(kt + 1)"), 0))
        a_pre = (f"      float4 ax[{copies}], ay[{copies}], bx[{copies}], by[{copies}];  // this k tile's values, the next's\n"
                 f"      if (k_tiles > 0)\n{_f32_load(it, k_at, copies, kmask, pa, koff, first_k, 'a')}")
        a_load = (f"        if (kt + 1 < k_tiles)\n"
                  f"{_f32_load(it, k_at, copies, kmask, pa, koff, next_k, 'b')}")
        a_fill = _f32_store(i_at, copies, dst, loop.lo_offset) + f"""#pragma unroll
        for (int j = 0; j < {copies}; ++j) ax[j] = bx[j], ay[j] = by[j];
"""
        arrive = "habu::fence_proxy_async(); habu::mbar_arrive(full);  // the parts, visible to wgmma"
    # the epilogue: the value of an accumulator register at (r, col), the row factor, the store
    def value(v: str, u: str | None = None) -> str:
        """The stored value from accumulator register `v` (and, for a pair, the second's `u`: by default the
        variable beside it)."""
        x = v if lw.scale is None else f"({float_expr(lw.scale, no_load, sizes)} * {v})"
        if pair is not None:  # the node of both (SwiGLU) from the two accumulators
            u = u or v.replace("v", "u")
            scaled = {pair.first: x, pair.second: u if pair.scale is None else
                      f"({float_expr(pair.scale, no_load, sizes)} * {u})"}
            x = float_expr(pair.node.rhs, lambda ld: scaled[ld.tensor], sizes)
        return x if lw.row_scale is None else f"(p_row * {x})"

    row_factor = ""
    if lw.row_scale is not None:  # P[r]: read once per accumulator row, where the row is inside
        rs = lw.row_scale
        p_rs = sig.pointer(rs.tensor, rs.dtype)
        row_factor = (f"          const float p_row = ({inside} && ({access_mask(rs, {'r': 'r'}, sizes, table)})) ? "
                      f"{load_value(rs.dtype, p_rs, access_offset(rs, {'r': 'r'}, sizes, lw.index_width, table))}"
                      " : 0.0f;  // the row's factor\n")
    at = {q: {"r": "r", "n": col} for q, col in ((0, "col"), (1, "col1"))}
    masks = {q: access_mask(lw.out, at[q], sizes, table) for q in (0, 1)}
    offs = {q: access_offset(lw.out, at[q], sizes, lw.index_width, table) for q in (0, 1)}
    if lw.store is Store.ATOMIC_ADD:  # the scatter: rows whose index repeats add into one element
        assert lw.out.dtype == "f32", "the scatter-accumulates rule allows f32 targets only"
        one = {q: f"atomicAdd({p_out} + ({offs[q]}), {value(f'v{q}')});" for q in (0, 1)}
    else:
        one = {q: store_value(lw.out.dtype, p_out, offs[q], value(f"v{q}")) for q in (0, 1)}
    store = f"""            const {it} col1 = col + {frag.pair - 1};  // the pair's second column
            const bool in0 = {inside} && ({masks[0]}), in1 = {inside} && ({masks[1]});
"""
    if lw.epilogue_pairs:  # both inside and the pair's offset even: one vector store (or vector atomic add)
        if lw.store is Store.ATOMIC_ADD:
            both = f"atomicAdd(reinterpret_cast<float2*>({p_out} + ({offs[0]})), make_float2({value('v0')}, {value('v1')}));"
        elif lw.out.dtype == "f32":
            both = f"*reinterpret_cast<float2*>({p_out} + ({offs[0]})) = make_float2({value('v0')}, {value('v1')});"
        else:
            pack = "habu::pack_bf16x2" if lw.out.dtype == "bf16" else "habu::pack_f16x2"
            both = f"*reinterpret_cast<habu::u32*>({p_out} + ({offs[0]})) = {pack}({value('v0')}, {value('v1')});"
        store += f"""            if (in0 && in1 && (({offs[0]}) & 1) == 0) {{
              {both}
            }} else {{
              if (in0) {one[0]}
              if (in1) {one[1]}
            }}
"""
    else:
        store += f"""            if (in0) {one[0]}
            if (in1) {one[1]}
"""
    v_reg = [c(frag.register_index(loop.pair_group(CExpr("j"), 0), CExpr("h"), q)) for q in range(frag.pair)]
    second = "acc" if loop.one_pair_instruction else "acc2"  # the second product's accumulator, its groups
    u_reg = [c(frag.register_index(loop.pair_group(CExpr("j"), 1), CExpr("h"), q)) for q in range(frag.pair)]
    pair_values = "" if pair is None else f"""            const float u0 = {second}[s][{u_reg[0]}];  // {pair.second}
            const float u1 = {second}[s][{u_reg[1]}];
"""
    if lw.epilogue_vectors is not None:
        epilogue_loops = _vector_epilogue(lw, sizes, table, it, row, inside, row_factor, value, p_out, second)
    elif lw.epilogue_quads:
        epilogue_loops = _quad_epilogue(lw, sig, sizes, table, it, row, inside, row_factor, value, p_out)
    else:
        epilogue_loops = f"""#pragma unroll
      for (int s = 0; s < {slabs}; ++s)
#pragma unroll
        for (int h = 0; h < {frag.halves}; ++h) {{  // the rows lane/4 and lane/4 + 8 of each warp's 16
          const int ti = {c(ops.slab_row(CExpr("cw"), CExpr("s")))} + {frag.row_in_warpgroup()};
          const {it} r = ({it})({row("ti")});
{row_factor}#pragma unroll
          for (int j = 0; j < {loop.column_groups()}; ++j) {{  // each thread holds pairs of adjacent columns
            const {it} col = ({it})({c(lw.column(CExpr("nt"), CExpr(frag.col())))});
            const float v0 = acc[s][{v_reg[0]}];
            const float v1 = acc[s][{v_reg[1]}];
{pair_values}{store}          }}
        }}
"""
    # the register split (setmaxnreg only where a warpgroup's count changes from the launch's)
    resized = split.producer != split.at_launch or split.consumer != split.at_launch
    dec = f"    habu::setmaxnreg_dec<{split.producer}>();\n" if split.producer != split.at_launch else ""
    inc = (f"    habu::setmaxnreg_inc<{split.consumer}>();  // {split.describe()}\n" if split.consumer != split.at_launch
           else f"    // {split.describe()}: no setmaxnreg\n")
    # each persistent loop's tile decode (the producer's and the consumers' are the same lines)
    tile_head = f"""      const {it} mt = ({it})({c(mt_x)});  // the tile's row tile, among every group's (bands of {loop.band})
      const {it} nt = ({it})({c(nt_x)});  // its column tile
      if (!({c(lw.live(CExpr("mt"), CExpr(f"starts[{groups}]")))})) continue;  // past the last row tile: nothing to do
      const int g = habu::tile_group<{it}>(starts, {groups}, mt);  // the tile's group
      const {it} m = ({it})({c(lw.tile_in_group(CExpr("mt"), CExpr("starts[g]")))});  // its row tile within the group
      const {it} end = offs[{c(lw.group_end(CExpr("g")))}];  // the group's rows end here
"""
    n0 = f"      const {it} n0 = ({it})({c(lw.column(CExpr('nt'), 0))});  // the tile's first column (W's box)\n"
    first, bound, step = loop.walk(CExpr("blockIdx.x"), CExpr("gridDim.x"), CExpr("gx") * CExpr("gy"))
    walk = (f"    for (long long lin = {c(first)}; lin < {c(bound)}; lin += {c(step)}) {{  // persistent: every tile "
            "once\n")
    body = f"""{wgmma_function(loop.mma_columns, "bf16", *trans)}
{kernel_opening(name, loop.threads, ops, ring, it, groups, lw.r)}  __shared__ {it} starts[{groups + 1}];  // starts[g]: the row tiles of the groups before g
{GRID_LAUNCH}{GRID_WAIT}  const int tid = threadIdx.x;
  const int wg = {c(loop.warpgroup(CExpr("tid")))};
  // full[s] (+0): the stage holds a k tile; empty[s] (+8): every consumer is done with it
  if (tid == 0) habu::ring_init(bars, {ring.stages}, {ring.full_arrivals}, {ring.empty_arrivals});
  habu::group_offsets<{it}>({e_ptr}, ({it})({rows}), {groups}, offs);
  __syncthreads();
  if (tid == 0 && offs[0] > 0) {table.check(lw.groups, "0", groups)};  // a group below 0: raise the error flag
  if (tid == 0 && offs[{groups}] < ({it})({rows})) {table.check(lw.groups, f"offs[{groups}]", groups)};  // a group past #{lw.g}
  habu::group_tile_starts<{it}>([](const {it}* o, int h) {{ return ({it})({c(lw.m_tiles(CExpr("o[h]"), CExpr("o[h + 1]")))}); }},
                              offs, {groups}, starts);
  __syncthreads();
  const long long gx = {gx}, gy = {gy};  // row tiles of any grouping × column tiles
  const long long k_tiles = {c(lw.k_steps(sizes))};
  int stage = {ring.start_stage};
  habu::u32 phase = {ring.start_phase};
  if (wg == 0) {{  // ---------------------------------------------------------------- producer
{dec}    const int ptid = {c(loop.producer_thread(CExpr("tid")))};
{walk}{tile_head}{n0}      for (int ri = ptid; nt == 0 && ri < {bm}; ri += {loop.warpgroup_size}) {{  // E sorted (GROUPS:): each row holds its group
        const {it} r = ({it})({row("ri")});
        if ({inside}) habu::grouping_ok((long long){e_ptr}[r], (long long)g, {index_code(model, lw.groups)}u, (long long)r);
      }}
      {it} a_row_off[{copies}];  // -1: past the group's end or A's edge (masked)
#pragma unroll
      for (int j = 0; j < {copies}; ++j) {{
        const {it} r = ({it})({row(i_at)});
        a_row_off[j] = ({inside} && ({rmask})) ? ({roff}) : ({it})-1;
      }}
{a_pre}      for (long long kt = 0; kt < k_tiles; ++kt) {{
        const {it} k0 = ({it})({k0});
{a_load}        const habu::u32 full = {ring_barrier(ring, "stage")};
        habu::mbar_wait({ring_barrier(ring, "stage", empty=True)}, {c(ring.producer_wait(CExpr("phase")))});
        const habu::u32 a_stage = smem_base + {ops.stage_tile("A", 0)}u + (habu::u32)stage * {ops.stage_stride}u;
        const habu::u32 b_stage = smem_base + {ops.stage_tile("B", 0)}u + (habu::u32)stage * {ops.stage_stride}u;
        if (ptid == 0) {{
          habu::mbar_expect_tx(full, {ring.expect_tx});
          {tma}
        }}
{a_fill}        {arrive}
        {ring_advance_line(ring)}
      }}
    }}
  }} else {{  // --------------------------------------------------------------------- consumers
{inc}    const int cw = {c(loop.consumer(CExpr("wg")))};
{"    const int ctid = tid % " + str(loop.warpgroup_size) + ";  // the thread within its warpgroup" + chr(10) if loop.a_convert else ""}    const int lane = {frag.lane_of()};
    const int warp = {frag.warp_of()};
{walk}{tile_head}      float acc[{slabs}][{regs}];
#pragma unroll
      for (int s = 0; s < {slabs}; ++s)
#pragma unroll
        for (int i = 0; i < {regs}; ++i) acc[s][i] = 0.0f;
{acc2.format(slabs=slabs, regs=regs)}{consumer_k_loop(ring, ops, mma, "      ", after_wait=split_pass(loop) if loop.a_convert else "")}{epilogue_loops}    }}
  }}
}}
"""
    epilogue = []
    if pair is not None:
        epilogue.append(f"with {pair.second} (its weights {pair.w.tensor}, a second TMA box) in a second accumulator; "
                        f"stores {pair.node.target} = f({pair.first}, {pair.second}), the node of both")
    if lw.row_scale is not None:
        epilogue.append(f"each row times {lw.row_scale.tensor}[r]")
    if lw.store is Store.ATOMIC_ADD:
        epilogue.append(f"scatter: adds into {lw.out.tensor} with atomicAdd (its prior contents are kept)")
    gathered = any(p.kind == "gather" for p in lw.a.positions)
    src = header(f"{name}: grouped GEMM over #{lw.g} = {groups} groups, wgmma {bm}×{bn}×{bk}, {ring.stages} stages, "
                 f"{loop.consumers} consumer warpgroup(s)",
                 [f"computes {', '.join(k.nodes)}",
                  f"A[{'gathered' if gathered else 'plain'} rows] by cp.async, W[{lw.groups}'s group of the tile] "
                  "by TMA, offsets found on the device", *epilogue])
    src += body.replace("SIGNATURE", sig.declaration())
    return CudaKernel(name, src, tuple(sig.params), loop.threads, loop.layout.total, lw,
                      register_demand=split.demand if resized else None)  # no setmaxnreg: nothing to wait for
