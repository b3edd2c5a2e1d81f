"""Grouped-GEMM kernels: `T[r n] = scale · Σ k A[IX[r] k] · W[E[r] n k]`, one launch over every group's tiles.

Printed from the `GroupedLowering`: each block finds the group offsets (`habu::group_offsets`, a binary
search per group over E, the lowering's `lower_bound`) and the row tiles' prefix sum
(`habu::group_tile_starts`, `tile_starts`) in shared memory, then its row tile's group
(`habu::tile_group`, `decode`); a block past the last row tile (`live`) returns. Its rows (`row`, masked
by `row_inside`), columns (`column`) and k steps (`k_index`) are the lowering's; A's rows are gathered
through the access's offset (IX[r], index-checked by its mask), W is read at the tile's group. Tiles of
bm × bk of A and bn × bk of W are staged in shared memory as 16-byte chunks (a masked chunk is zeros),
and warps of (bm / warps_m) × (bn / warps_n) multiply them with mma.sync m16n8k16 (bf16, f32
accumulate), fragments read from shared memory in the PTX layouts; the epilogue stores each
accumulator where its row and column are inside. An f32 A is staged as two bf16 parts (`habu::split_bf16x8`,
the lowering's `a_parts`), each multiplied with W; a row factor P[r] multiplies the accumulator in the
epilogue; a scatter (`T[IX[r] n] += …`, the lowering's ATOMIC_ADD store) adds it into the element the
output access names, with f32 atomicAdd.
"""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c, cmin
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
from habu.emit_cuda.geometry import LaunchGeometry, cmax, register_geometry
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.general import Store
from habu.lower.grouped import GroupedLowering
from habu.spec.ir import Model


def _no_load(ld) -> str:
    raise ValueError("the scale of a grouped GEMM reads no tensor")


def emit_grouped(name: str, model: Model, lw: GroupedLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    table = table_reader(sig, model, it)
    groups = sizes[lw.g]
    if not isinstance(groups, int):
        raise ValueError(f"{name}: the number of groups #{lw.g} must be known when the kernel is compiled")
    loop = lw.mma
    if loop is None:
        raise ValueError(f"{name}: the grouped kernel has no mma.sync main loop")
    threads, bm, bn, bk = loop.threads, k.bm, k.bn, loop.bk
    mi, ni = loop.mma_tiles
    chunks_a, chunks_b = loop.copies(loop.a_copy), loop.copies(loop.w_copy)
    frag, grid = loop.fragment, loop.grid
    tid, lane = CExpr("tid"), CExpr("lane")

    def tile(array: str, t, row, col) -> str:
        """Element (row, col) of a staged tile, as the 2-D shared array `array` holds it."""
        r, cc = t.storage(row, col)
        return f"{array}[{c(r)}][{c(cc)}]"

    def decl(array: str, t) -> str:
        return f"{array}[{t.rows}][{t.row_elems}]"

    def copy_decode(copy, what: str) -> str:
        """A thread's q-th copy: its chunk, the operand row and k of its first element."""
        mn, kk = copy.element(*copy.along(CExpr("chunk")))
        return f"const int chunk = {c(loop.chunk(tid, CExpr('q')))}, {what} = {c(mn)}, kk = {c(kk)};"

    def word(array: str, t, read, row: str, reg: int) -> str:
        d_mn, d_k = read.word(reg)
        return (f"*reinterpret_cast<const habu::u32*>(&"
                f"{tile(array, t, CExpr(row) + d_mn if d_mn else CExpr(row), CExpr('kc') + d_k if d_k else CExpr('kc'))})")
    acc_row, acc_col = loop.accumulator(CExpr("wm"), CExpr("wn"), CExpr("i"), CExpr("j"), lane, CExpr("q"))
    e_ptr = sig.pointer(lw.groups, model.tensor(lw.groups).dtype.name)  # type: ignore[union-attr]
    pa, pw = sig.pointer(lw.a.tensor, lw.a.dtype), sig.pointer(lw.w.tensor, "bf16")
    p_out = sig.pointer(lw.out.tensor, lw.out.dtype, writes=True)
    split = lw.a_parts == 2
    rows = c(sizes[lw.r])
    m, mt = CExpr("m"), CExpr("mt")
    row = lambda i: c(lw.row(CExpr("offs[g]"), m, CExpr(i)))  # noqa: E731
    a_coord, w_coord, o_coord = {"r": "r", "k": "kx"}, {"g": "g", "n": "col", "k": "kx"}, {"r": "r", "n": "col"}
    a_mask = access_mask(lw.a, a_coord, sizes, table)
    w_mask = access_mask(lw.w, w_coord, sizes, table)
    o_mask = access_mask(lw.out, o_coord, sizes, table)
    a_off = access_offset(lw.a, a_coord, sizes, lw.index_width, table)
    w_off = access_offset(lw.w, w_coord, sizes, lw.index_width, table)
    o_off = access_offset(lw.out, o_coord, sizes, lw.index_width, table)
    value = "acc[i][j][q]" if lw.scale is None else f"({float_expr(lw.scale, _no_load, sizes)} * acc[i][j][q])"
    pair = lw.pair
    if pair is not None:  # the node of both GEMMs from the two accumulators (SwiGLU)
        assert lw.a_parts == 1, "a pair's A is bf16"
        scaled = {pair.first: value, pair.second: "acc2[i][j][q]" if pair.scale is None else
                  f"({float_expr(pair.scale, _no_load, sizes)} * acc2[i][j][q])"}
        value = float_expr(pair.node.rhs, lambda ld: scaled[ld.tensor], sizes)
    row_factor = ""
    if lw.row_scale is not None:  # P[r]: read once per accumulator row, where the row is inside
        rs = lw.row_scale
        p_rs = sig.pointer(rs.tensor, rs.dtype)
        value = f"(p_row * {value})"
        row_factor = (f"        const float p_row = ({access_mask(rs, {'r': 'r'}, sizes, table)}) ? "
                      f"{load_value(rs.dtype, p_rs, access_offset(rs, {'r': 'r'}, sizes, lw.index_width, table))}"
                      " : 0.0f;  // the row's factor\n")
    if lw.store is Store.ATOMIC_ADD:  # the scatter: rows whose index repeats add into one element
        assert lw.out.dtype == "f32", "the scatter-accumulates rule allows f32 targets only"
        store = f"atomicAdd({p_out} + ({o_off}), {value});"
    else:
        store = store_value(lw.out.dtype, p_out, o_off, value)
    kx = c(lw.k_index(CExpr("step"), CExpr("kk")))
    block_mt, block_nt = lw.block_tile(CExpr("blockIdx.x"), CExpr("blockIdx.y"))

    def a_words(array: str) -> str:
        return "".join(f"        a[{r}] = {word(array, loop.a_tile, loop.a_read, 'rr', r)};\n"
                       for r in range(loop.a_read.registers))

    def b_words(reg: str, array: str) -> str:
        return "".join(f"        {reg}[j][{r}] = {word(array, loop.w_tile, loop.w_read, 'n', r)};\n"
                       for r in range(loop.w_read.registers))
    src_body = f"""extern "C" __global__ void __launch_bounds__({threads}, 1) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  __shared__ {it} offs[{groups + 1}];  // offs[g]: the first row of group g (offs[{groups}] = #{lw.r})
  __shared__ {it} starts[{groups + 1}];  // starts[g]: the row tiles of the groups before g
  __shared__ __align__(16) habu::bf16 {decl("As", loop.a_tile)};  // A's rows of the tile, {bk} k at a time
{{A_LO_DECL}}  __shared__ __align__(16) habu::bf16 {decl("Ws", loop.w_tile)};  // the group's weights, {bn} columns × {bk} k
{{PAIR_DECL}}  const int tid = threadIdx.x;
  habu::group_offsets<{it}>({e_ptr}, ({it})({rows}), {groups}, offs);
  __syncthreads();
  if (tid == 0 && offs[0] > 0) {table.check(lw.groups, "0", groups)};  // a group below 0: raise the error flag
  if (tid == 0 && offs[{groups}] < ({it})({rows})) {table.check(lw.groups, f"offs[{groups}]", groups)};  // a group past #{lw.g}
  habu::group_tile_starts<{it}>([](const {it}* o, int h) {{ return ({it})({c(lw.m_tiles(CExpr("o[h]"), CExpr("o[h + 1]")))}); }},
                              offs, {groups}, starts);
  __syncthreads();
  const {it} mt = ({it}){c(block_mt)};  // this block's row tile, among every group's
  const {it} nt = ({it}){c(block_nt)};  // its column tile
  if (!({c(lw.live(mt, CExpr(f"starts[{groups}]")))})) return;  // past the last row tile: nothing to do
  const int g = habu::tile_group<{it}>(starts, {groups}, mt);  // the tile's group
  const {it} m = ({it})({c(lw.tile_in_group(mt, CExpr("starts[g]")))});  // its row tile within the group
  const {it} end = offs[{c(lw.group_end(CExpr("g")))}];  // the group's rows end here
  for (int ri = tid; nt == 0 && ri < {bm}; ri += {threads}) {{  // E sorted (GROUPS:): each row holds its group
    const {it} r = ({it})({row("ri")});
    if ({c(lw.row_inside(CExpr("r"), CExpr("end")))}) habu::grouping_ok((long long){e_ptr}[r], (long long)g, {index_code(model, lw.groups)}u, (long long)r);
  }}
  const int warp = {c(loop.warp(tid))}, lane = {c(loop.lane(tid))};
  const int wm = {c(grid.warp_m(CExpr("warp")))}, wn = {c(grid.warp_n(CExpr("warp")))};
  float acc[{mi}][{ni}][{frag.registers(1)}];
#pragma unroll
  for (int i = 0; i < {mi}; ++i)
#pragma unroll
    for (int j = 0; j < {ni}; ++j)
#pragma unroll
      for (int q = 0; q < {frag.registers(1)}; ++q) acc[i][j][q] = 0.0f;
{{PAIR_INIT}}  for ({it} step = 0; step < ({it})({c(lw.k_steps(sizes))}); ++step) {{
#pragma unroll
    for (int q = 0; q < {chunks_a}; ++q) {{  // A: 16-byte chunks of its rows, gathered
      {copy_decode(loop.a_copy, "i")}
      const {it} r = ({it})({row("i")});
      const {it} kx = ({it})({kx});
{{A_STAGE}}    }}
#pragma unroll
    for (int q = 0; q < {chunks_b}; ++q) {{  // W[g]: 16-byte chunks of its rows
      {copy_decode(loop.w_copy, "j")}
      const {it} col = ({it})({c(lw.column(CExpr("nt"), CExpr("j")))});
      const {it} kx = ({it})({kx});
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if ({w_mask}) v = *reinterpret_cast<const uint4*>({pw} + ({w_off}));
      *reinterpret_cast<uint4*>(&{tile("Ws", loop.w_tile, CExpr("j"), CExpr("kk"))}) = v;
    }}
{{PAIR_STAGE}}    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < {bk}; ks += {loop.mma_k}) {{
      const int kc = {c(loop.k_col(CExpr("ks"), lane))};
      habu::u32 b[{ni}][{loop.w_read.registers}];
#pragma unroll
      for (int j = 0; j < {ni}; ++j) {{
        const int n = {c(loop.w_row(CExpr("wn"), CExpr("j"), lane))};
{b_words("b", "Ws")}      }}
{{PAIR_B}}#pragma unroll
      for (int i = 0; i < {mi}; ++i) {{
        const int rr = {c(loop.a_row(CExpr("wm"), CExpr("i"), lane))};
        habu::u32 a[{loop.a_read.registers}];
{a_words("As")}#pragma unroll
        for (int j = 0; j < {ni}; ++j) habu::mma_bf16_16816(acc[i][j], a, b[j]);
{{A_LO_MMA}}{{PAIR_MMA}}      }}
    }}
    __syncthreads();
  }}
#pragma unroll
  for (int i = 0; i < {mi}; ++i)
#pragma unroll
    for (int j = 0; j < {ni}; ++j)
#pragma unroll
      for (int q = 0; q < {frag.registers(1)}; ++q) {{  // the accumulator's rows lane/4 (+8 for q >= 2), columns 2·(lane%4) + q%2
        const int ti = {c(acc_row)};
        const int tj = {c(acc_col)};
        const {it} r = ({it})({row("ti")});
        const {it} col = ({it})({c(lw.column(CExpr("nt"), CExpr("tj")))});
{row_factor}        if ({c(lw.row_inside(CExpr("r"), CExpr("end")))} && ({o_mask})) {store}
      }}
}}
"""
    inside = c(lw.row_inside(CExpr("r"), CExpr("end")))
    a_at = tile("As", loop.a_tile, CExpr("i"), CExpr("kk"))
    if split:
        a_lo_decl = f"  __shared__ __align__(16) habu::bf16 {decl('Al', loop.a_tile)};  // the low bf16 parts of A's f32 values\n"
        a_stage = f"""      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f), y = x;
      if ({inside} && ({a_mask})) {{
        x = *reinterpret_cast<const float4*>({pa} + ({a_off}));
        y = *reinterpret_cast<const float4*>({pa} + ({a_off}) + 4);
      }}
      habu::split_bf16x8(x, y, *reinterpret_cast<uint4*>(&{a_at}), *reinterpret_cast<uint4*>(&{a_at.replace("As", "Al", 1)}));
"""
        lo = a_words("Al").split("\n", 1)
        a_lo_mma = f"""{lo[0]}  // A's low parts, times the same W
{lo[1]}#pragma unroll
        for (int j = 0; j < {ni}; ++j) habu::mma_bf16_16816(acc[i][j], a, b[j]);
"""
    else:
        a_lo_decl = a_lo_mma = ""
        a_stage = f"""      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if ({inside} && ({a_mask})) v = *reinterpret_cast<const uint4*>({pa} + ({a_off}));
      *reinterpret_cast<uint4*>(&{a_at}) = v;
"""
    parts = {"PAIR_DECL": "", "PAIR_INIT": "", "PAIR_STAGE": "", "PAIR_B": "", "PAIR_MMA": ""}
    if pair is not None:
        pw2 = sig.pointer(pair.w.tensor, "bf16")
        w2_mask = access_mask(pair.w, w_coord, sizes, table)
        w2_off = access_offset(pair.w, w_coord, sizes, lw.index_width, table)
        parts["PAIR_DECL"] = (f"  __shared__ __align__(16) habu::bf16 {decl('Ws2', loop.w_tile)};  // the second weights "
                              f"({pair.w.tensor}[g], for {pair.second})\n")
        parts["PAIR_INIT"] = f"""  float acc2[{mi}][{ni}][{frag.registers(1)}];  // {pair.second}
#pragma unroll
  for (int i = 0; i < {mi}; ++i)
#pragma unroll
    for (int j = 0; j < {ni}; ++j)
#pragma unroll
      for (int q = 0; q < {frag.registers(1)}; ++q) acc2[i][j][q] = 0.0f;
"""
        parts["PAIR_STAGE"] = f"""#pragma unroll
    for (int q = 0; q < {chunks_b}; ++q) {{  // {pair.w.tensor}[g]: 16-byte chunks of its rows
      {copy_decode(loop.w_copy, "j")}
      const {it} col = ({it})({c(lw.column(CExpr("nt"), CExpr("j")))});
      const {it} kx = ({it})({kx});
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if ({w2_mask}) v = *reinterpret_cast<const uint4*>({pw2} + ({w2_off}));
      *reinterpret_cast<uint4*>(&{tile("Ws2", loop.w_tile, CExpr("j"), CExpr("kk"))}) = v;
    }}
"""
        parts["PAIR_B"] = f"""      habu::u32 b2[{ni}][{loop.w_read.registers}];
#pragma unroll
      for (int j = 0; j < {ni}; ++j) {{
        const int n = {c(loop.w_row(CExpr("wn"), CExpr("j"), lane))};
{b_words("b2", "Ws2")}      }}
"""
        parts["PAIR_MMA"] = f"""#pragma unroll
        for (int j = 0; j < {ni}; ++j) habu::mma_bf16_16816(acc2[i][j], a, b2[j]);  // the same A rows
"""
    for key, text in parts.items():
        src_body = src_body.replace("{" + key + "}", text)
    src_body = src_body.replace("{A_LO_DECL}", a_lo_decl).replace("{A_STAGE}", a_stage).replace("{A_LO_MMA}", a_lo_mma)
    epilogue = []
    if pair is not None:
        epilogue.append(f"with {pair.second} (its weights {pair.w.tensor}) in a second accumulator; stores "
                        f"{pair.node.target} = f({pair.first}, {pair.second}), the node of both")
    if split:
        epilogue.append(f"A ({lw.a.tensor}, f32) staged as bf16 hi + lo parts")
    if lw.row_scale is not None:
        epilogue.append(f"each row times {lw.row_scale.tensor}[r]")
    if lw.store is Store.ATOMIC_ADD:
        epilogue.append(f"scatter: adds into {lw.out.tensor} with atomicAdd (its prior contents are kept)")
    src = header(f"{name}: grouped GEMM over #{lw.g} = {groups} groups, tiles {bm}×{bn}×{bk}, "
                 f"{k.warps_m}×{k.warps_n} warps of mma.sync m16n8k16 bf16",
                 [f"computes {', '.join(k.nodes)}",
                  f"A[{'gathered' if any(p.kind == 'gather' for p in lw.a.positions) else 'plain'} rows], "
                  f"W[{lw.groups}'s group of the tile], offsets found on the device", *epilogue])
    src += src_body.replace("SIGNATURE", sig.declaration())
    return CudaKernel(name, src, tuple(sig.params), threads, 0, lw)


def _grouped_blocks(lw: GroupedLowering, sizes, slots: int) -> tuple[int, int, int]:
    """mma.sync: row tiles of any grouping × column tiles; the wgmma loop: persistent, the blocks resident
    at once (at most one per tile), each walking the tiles blockIdx.x, + gridDim.x, ..."""
    x, y = lw.grid(sizes)
    if lw.uses_wgmma:
        return (max(1, min(int(x) * int(y), slots)), 1, 1)
    return (max(1, int(x)), max(1, int(y)), 1)


def _grouped_formula(lw: GroupedLowering, s, slots):
    x, y = lw.grid(s)
    if lw.uses_wgmma:
        return (cmax(1, cmin(x * y, slots)), "1", "1")
    return (cmax(1, x), cmax(1, y), "1")


register_geometry(GroupedLowering, LaunchGeometry(
    blocks=_grouped_blocks, formula=_grouped_formula,
    slots=lambda lw, cluster: "sm_count" if lw.uses_wgmma else None))
