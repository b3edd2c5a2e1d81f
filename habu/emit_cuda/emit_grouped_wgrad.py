"""The grouped weight gradient on wgmma (habu/lower/grouped_wgrad.py): `O[E[r] m n] += scale · P[r] · A[r m] · B[r n]`,
one block per (output tile, group), the group's rows its k axis.

Printed from the `GroupedWgradLowering` and its `WgradLoop`: the group offsets (the block's group's, the next's,
the first's and the last's, a warp each: `habu::group_offsets_warp`, the lowering's `lower_bound`), the block's
tile (`block_tile`), its group's k tiles (`k_tiles`, `row`, masked by `row_inside`), the producer's chunks
(`chunk`, `a_source`, `b_source`; a gather's indices staged ahead in the index ring: `index_tile`, `index_slot`,
`index_entry`, `index_wait`) and where it stores them
(`a_store_offset`, `b_store_offset`: an f32 A's hi and lo parts at `a_stored_column`), through its registers or
copied there by cp.async (`copied_async`: after the stage's empty wait, the thread's noinc arrival), the ring (the
contraction path's `MbarrierRing`: the producer's 128 arrivals a stage), the consumers' descriptors (the
lowering's `WgmmaOperands`, both operands MN-major: the instruction's transpose bits) for each real slab's
parts (`part_slab`) into one accumulator (`acc_row`), and the epilogue's read-add-store of each accumulator
pair into O[g, m, n]. Persistent blocks (`WgradLoop.persistent`) walk the work items (`walk`, `work_item`) around
both roles' loops, every group's offsets found once (`habu::group_offsets_warps`)."""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c, cmin
from habu.emit_cuda.common import (
    CTYPE,
    GRID_LAUNCH,
    GRID_WAIT,
    Signature,
    TableReader,
    access_mask,
    access_offset,
    float_expr,
    header,
    index_code,
    index_type,
    load_value,
)
from habu.emit_cuda.emit_fma import table_reader
from habu.emit_cuda.emit_grouped_wgmma import consumer_k_loop, desc_text, kernel_opening, no_load
from habu.emit_cuda.emit_wgmma import ring_advance_line, ring_barrier
from habu.emit_cuda.geometry import GRID_2D, LaunchGeometry, cmax, register_geometry
from habu.emit_cuda.kernel import CudaKernel
from habu.emit_cuda.wgmma import wgmma_function, wgmma_name
from habu.lower.grouped_wgrad import GroupedWgradLowering, wgrad_refusal
from habu.spec.ir import Model


def emit_grouped_wgrad(name: str, model: Model, lw: GroupedWgradLowering, static: dict[str, int]) -> CudaKernel:
    k, loop = lw.kernel, lw.loop
    refused = wgrad_refusal(k, lw.a.dtype, lw.b.dtype, lw.row_scale is not None)
    if refused or loop is None:
        raise ValueError(f"{name}: {refused or 'the grouped weight gradient has no stage maps for this tile'}")
    ops, ring = loop.operands, loop.ring
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    table = table_reader(sig, model, it)
    groups = sizes[lw.g]
    if not isinstance(groups, int):
        raise ValueError(f"{name}: the number of groups #{lw.g} must be known when the kernel is compiled")
    e_ptr = sig.pointer(lw.groups, model.tensor(lw.groups).dtype.name)  # type: ignore[union-attr]
    pa = sig.pointer(lw.a.tensor, lw.a.dtype)
    pb = sig.pointer(lw.b.tensor, lw.b.dtype)
    p_out = sig.pointer(lw.out.tensor, lw.out.dtype, writes=True)
    rows = c(sizes[lw.r])
    # the search's rounds: for #R where it is known when the kernel is compiled, else for the most rows the index
    # width addresses (the rounds past an empty range do nothing)
    search_rows = sizes[lw.r] if isinstance(sizes[lw.r], int) else 2 ** (lw.index_width - 1) - 1
    mt_x, nt_x = lw.block_tile(CExpr("bx"), CExpr("n_tiles"))
    persistent = loop.persistent
    # a work item: a persistent block's w-th (`walk`, `work_item`), else the block's own (blockIdx.x, blockIdx.y)
    bx_x, g_x = lw.work_item(CExpr("w"), CExpr("tiles")) if persistent else (CExpr("blockIdx.x"), CExpr("blockIdx.y"))

    # the index a copied side's chunk rows gather through, read into registers (`{side}ix`) from the index ring,
    # where the producer staged it `index_depth` k tiles ahead (`lw.staged_index`, `loop.index_tile`), so no copy
    # waits on a load of it
    held_index = {side: HeldRowIndex(table, f"{side.lower()}ix") for side in "AB" if lw.staged_index(side)}

    def stage_index_lines(side: str, count: int, tile: str, pad: str = "      ") -> str:
        """The producer thread's cp.async copies of IX[r] of its chunks' rows of k tile `tile` into their entries of
        the tile's slot (zero where the row is past the group's end: never read)."""
        source = loop.a_source if side == "A" else loop.b_source
        ki, _ = source(loop.chunk(CExpr("ptid"), CExpr("j")))
        (name,) = lw.row_tables(side)
        dtype = model.tensor(name).dtype  # type: ignore[union-attr]
        at = loop.index_entry(side, loop.index_slot(CExpr(tile)), CExpr("ptid"), CExpr("j"))
        return f"""{pad}if ({c(loop.index_staged(CExpr(tile), CExpr("k_tiles")))}) {{  // (none past the item's k tiles)
#pragma unroll
{pad}  for (int j = 0; j < {count}; ++j) {{  // {name}[r] of {side}'s chunk rows of that k tile, into its slot
{pad}    const {it} r = ({it})({c(lw.row(CExpr("lo"), CExpr(tile), ki))});
{pad}    const bool ok = {c(lw.row_inside(CExpr("r"), CExpr("end")))};
{pad}    habu::cp_async<{dtype.bytes}>(smem_base + (habu::u32)({c(at)}), {sig.pointer(name, dtype.name)} + (ok ? r : 0), ok);
{pad}  }}
{pad}}}
"""

    def read_index_lines(side: str, count: int) -> str:
        (name,) = lw.row_tables(side)
        dtype = model.tensor(name).dtype  # type: ignore[union-attr]
        at = loop.index_entry(side, loop.index_slot(CExpr("kt")), CExpr("ptid"), CExpr("j"))
        return f"""#pragma unroll
        for (int j = 0; j < {count}; ++j)  // {name}[r] of {side}'s chunk rows of k tile kt, from its slot
          {side.lower()}ix[j] = ({it})habu::load_shared_index<{CTYPE[dtype.name]}>(smem_base + (habu::u32)({c(at)}));
"""

    # the producer's chunks: thread ptid's j-th of A's (then of B's), its row in the k tile and first column;
    # into the registers `{side}v`/`{side}x, {side}y` + `suffix` (the next k tile's: "_n"), the row factor applied
    # at once, or (`deferred`) its value kept beside them (`{side}f_n`) and applied by `settle_lines`
    def chunk_lines(side: str, count: int, kt: str = "kt", suffix: str = "", deferred: bool = False) -> str:
        source = loop.a_source if side == "A" else loop.b_source
        ki, col = source(loop.chunk(CExpr("ptid"), CExpr("j")))
        acc, p, axis = (lw.a, pa, "m") if side == "A" else (lw.b, pb, "n")
        tile_col = lw.column_m(CExpr("mt"), col) if side == "A" else lw.column_n(CExpr("nt"), col)
        coord = {"k": "r", axis: "col"}
        reader = held_index.get(side, table) if loop.copied_async(side) else table  # a copy's index from the ring
        mask = access_mask(acc, coord, sizes, reader)
        off = access_offset(acc, coord, sizes, lw.index_width, reader)
        low = side.lower()
        chunk = f"{low}x{suffix}[j], {low}y{suffix}[j]" if side == "A" and acc.dtype == "f32" else f"{low}v{suffix}[j]"
        factor = ""
        if side == "A" and lw.row_scale is not None:  # an f32 A's factor before its split; a bf16 A's rounds each product
            rs = lw.row_scale
            value = load_value(rs.dtype, sig.pointer(rs.tensor, rs.dtype),
                               access_offset(rs, {"k": "r"}, sizes, lw.index_width, table))
            factor = (f"          {low}f{suffix}[j] = ok ? {value} : 0.0f;  // the row's factor {rs.tensor}[r], applied later\n"
                      if deferred else
                      f"          if (ok) habu::scale_chunk({chunk}, {value});  // the row's factor {rs.tensor}[r]\n")
        load = f"          habu::load_chunk({p} + (ok ? ({off}) : 0), ok, {chunk});\n{factor}"
        if loop.copied_async(side):  # straight into the stage (its slot as the register store's), zeros where masked
            if side == "A" and loop.parts == 2:  # an f32 chunk raw, two halves, where the consumers split it
                load = "".join(
                    f"          habu::cp_async<16>(a_stage + (habu::u32)({c(loop.a_landed_offset(col, ki, half))}), "
                    f"{p} + (ok ? ({off}) + {c(loop.half_source(half))} : 0), ok);\n" for half in (0, 1))
            else:
                at = loop.a_landed_offset(col, ki) if side == "A" else loop.b_store_offset(col, ki)
                load = (f"          habu::cp_async<16>({low}_stage + (habu::u32)({c(at)}), {p} + (ok ? ({off}) : 0), "
                        "ok);\n")
        how = "copied into the stage" if loop.copied_async(side) else "loaded"
        return f"""#pragma unroll
        for (int j = 0; j < {count}; ++j) {{  // {side}'s chunks of k tile {kt}, {how}: row {c(ki)}, 8 columns from {c(col)}
          const {it} r = ({it})({c(lw.row(CExpr("lo"), CExpr(kt), ki))});
          const {it} col = ({it})({c(tile_col)});
          const bool ok = {c(lw.row_inside(CExpr("r"), CExpr("end")))} && ({mask});
{load}        }}
"""

    def settle_lines(side: str, count: int) -> str:
        """The next k tile's registers (their loads in flight under this tile's stores) scaled by their row's factor
        and made the current ones."""
        low = side.lower()
        f32 = side == "A" and lw.a.dtype == "f32"
        names = (f"{low}x", f"{low}y") if f32 else (f"{low}v",)
        scale = (f"habu::scale_chunk({', '.join(f'{n}_n[j]' for n in names)}, {low}f_n[j]); "
                 if side == "A" and lw.row_scale is not None else "")
        moves = " ".join(f"{n}[j] = {n}_n[j];" for n in names)
        return f"""#pragma unroll
          for (int j = 0; j < {count}; ++j) {{ {scale}{moves} }}
"""

    a_per, b_per = loop.a_chunks() // loop.warpgroup_size, loop.b_chunks() // loop.warpgroup_size
    counts = {"A": a_per, "B": b_per}
    held = [side for side in "AB" if not loop.copied_async(side)]  # the sides through registers
    two = loop.register_depth == 2

    def declare(suffix: str) -> str:
        decls = {"A": f"float4 ax{suffix}[{a_per}], ay{suffix}[{a_per}];" if loop.parts == 2 else
                 f"uint4 av{suffix}[{a_per}];", "B": f"uint4 bv{suffix}[{b_per}];"}
        factor = f" float af{suffix}[{a_per}];" if suffix and "A" in held and lw.row_scale is not None else ""
        return " ".join(decls[side] for side in held) + factor

    held_regs = f"{declare('')}  // the chunks of the k tile being stored" if held else ""
    ahead = c(loop.load_tile(CExpr("kt")))  # the k tile the held registers load at step kt (`load_tile`)
    if two:  # the next k tile's loads in flight under this one's wait and stores
        held_regs += f"\n    {declare('_n')}  // the next k tile's, loading\n" + "".join(
            chunk_lines(side, counts[side], c(loop.load_tile(-1))) for side in held)
        loads = f"        if ({ahead} < k_tiles) {{  // the next k tile's loads, issued before this one's stores\n" + \
            "".join(chunk_lines(side, counts[side], ahead, "_n", True) for side in held) + "        }\n"
        settle = f"        if ({ahead} < k_tiles) {{\n" + "".join(settle_lines(side, counts[side]) for side in held) + \
            "        }\n"
    elif loop.register_depth == 1:
        loads, settle = "".join(chunk_lines(side, counts[side], ahead) for side in held), ""
    else:
        raise ValueError(f"{name}: the producer holds one or two k tiles in registers, not {loop.register_depth}")
    copies = "".join(chunk_lines(side, counts[side]) for side in "AB" if loop.copied_async(side))
    index_regs = index_read = index_stage = ""
    if held_index:  # the first index_depth k tiles' indices staged before the loop, a cp.async group each
        depth = loop.index_depth
        index_regs = "".join(f"{it} {side.lower()}ix[{counts[side]}];  // the chunk rows' {lw.row_tables(side)[0]}[r] "
                             "of the k tile being copied\n    " for side in held_index) + f"""#pragma unroll
    for (int t = 0; t < {depth}; ++t) {{  // the first {depth} k tiles' indices (steps t − {depth}), a cp.async group each
      const long long tile = {c(loop.index_tile(CExpr("t") - depth))};
{"".join(stage_index_lines(side, counts[side], "tile") for side in held_index)}      habu::cp_async_commit();
    }}
    """
        index_read = (f"        habu::cp_async_wait<{loop.index_wait()}>();  // k tile kt's indices landed (its group: "
                      f"the later {loop.index_wait()} may be in flight)\n"
                      + "".join(read_index_lines(side, counts[side]) for side in held_index))
        index_stage = (f"        {{  // the indices of k tile {c(loop.index_tile(CExpr('kt')))}, {depth} ahead, into "
                       f"their slot (past the group's end: zeros), then the step's group closed\n"
                       f"          const long long tile = {c(loop.index_tile(CExpr('kt')))};\n"
                       + "".join(stage_index_lines(side, counts[side], "tile", "          ") for side in held_index)
                       + "        }\n        habu::cp_async_commit();\n")
    a_ki, a_col = loop.a_source(loop.chunk(CExpr("ptid"), CExpr("j")))
    b_ki, b_col = loop.b_source(loop.chunk(CExpr("ptid"), CExpr("j")))
    if loop.parts == 2:
        a_store = (f"habu::store_split_bf16x8(a_stage + (habu::u32)({c(loop.a_store_offset(a_col, a_ki, 0))}), "
                   f"a_stage + (habu::u32)({c(loop.a_store_offset(a_col, a_ki, 1))}), ax[j], ay[j]);  // hi, lo")
    else:
        a_store = f"habu::store_shared16(a_stage + (habu::u32)({c(loop.a_store_offset(a_col, a_ki, 0))}), av[j]);"
    b_store = f"habu::store_shared16(b_stage + (habu::u32)({c(loop.b_store_offset(b_col, b_ki))}), bv[j]);"
    stores = "".join(f"#pragma unroll\n        for (int j = 0; j < {counts[side]}; ++j) {store}\n"
                     for side, store in (("A", a_store), ("B", b_store)) if not loop.copied_async(side))
    # the stage's arrival: a thread's register stores made visible to wgmma (the async proxy), then its arrival
    # once its copies have landed (cp.async's noinc arrival counts as the thread's own), as the wgmma path's
    arrive = ("habu::fence_proxy_async(); habu::mbar_arrive(full);  // the stage's chunks, visible to wgmma"
              if not loop.any_async else "habu::cp_async_arrive(full);  // as the thread's copies land"
              if not loop.any_registers else
              "habu::fence_proxy_async(); habu::cp_async_arrive(full);  // the stores visible, then as the copies land")

    before_wait, after_wait = convert_lines(lw, sig, sizes, table, it) if loop.a_convert else ("", "")
    ctid = f"    const int ctid = tid % {loop.warpgroup_size};  // the thread within its warpgroup\n" if loop.a_convert else ""

    # the consumers: each real slab q, each part, one wgmma into acc[q] (both operands MN-major)
    trans = (ops.b_desc.mn_major, ops.a_desc.mn_major)
    b_desc = desc_text(ops.b_desc, "b_stage", ops.b_start(CExpr("kk")))
    mma = "\n".join(
        f"          {wgmma_name(k.bn, 'bf16', *trans)}(acc[{q}], "
        f"{desc_text(ops.a_desc, 'a_stage', ops.a_start(CExpr('cw'), loop.part_slab(q, part), CExpr('kk')))}, {b_desc}, 1);"
        f"{'  // the low parts' if part else ''}"
        for q in range(loop.slabs) for part in range(loop.parts))
    frag = loop.fragment
    regs = frag.registers(k.bn // frag.col_step)
    v_reg = [c(frag.register_index(CExpr("j"), CExpr("h"), q)) for q in range(frag.pair)]
    scale = "" if lw.scale is None else f"{float_expr(lw.scale, no_load, sizes)} * "
    at = {q: {"g": "g", "m": "m", "n": col} for q, col in ((0, "col"), (1, "col1"))}
    masks = {q: access_mask(lw.out, at[q], sizes, table) for q in (0, 1)}
    offs = {0: access_offset(lw.out, at[0], sizes, lw.index_width, table)}
    split = loop.registers
    # the register split (setmaxnreg only where a warpgroup's count changes from the launch's)
    resized = split.producer != split.at_launch or split.consumer != split.at_launch
    dec = f"    habu::setmaxnreg_dec<{split.producer}>();\n" if split.producer != split.at_launch else ""
    inc = (f"    habu::setmaxnreg_inc<{split.consumer}>();  // {split.describe()}\n" if split.consumer != split.at_launch
           else f"    // {split.describe()}: no setmaxnreg\n")
    batch = loop.epilogue_batch
    # the b-th column group of round `rnd` (`epilogue_group`): O[g, m, col] and O[g, m, col1] after it (n is O's
    # last axis)
    pair_lines = f"""            const int j = {c(loop.epilogue_group(CExpr("rnd"), CExpr("b")))};
            const {it} col = ({it})({c(lw.column_n(CExpr("nt"), CExpr(frag.col())))});
            const {it} col1 = col + {frag.pair - 1};
            const bool in0 = {masks[0]}, in1 = {masks[1]};  // (col1 inside: col is too)
            const {it} at = in0 ? ({offs[0]}) : 0;
"""
    skip = "continue" if persistent else "return"  # an empty group's item: nothing to add (a block's: every thread)
    def item_lines(pad: str) -> str:
        """The work item's decode: its group and tile, the group's rows and k tiles, an empty group skipped."""
        return "".join(f"{pad}{line}\n" for line in (
            f"const int g = (int)({c(g_x)});  // the item's group",
            f"const {it} bx = ({it})({c(bx_x)});  // and its output tile among the group's",
            f"const {it} mt = ({it})({c(mt_x)});  // the tile of #{lw.m}",
            f"const {it} nt = ({it})({c(nt_x)});  // and of #{lw.n}",
            f"const {it} lo = offs[g], end = offs[{c(lw.group_end(CExpr('g')))}];  // the group's rows: its k axis",
            f"const long long k_tiles = {c(lw.k_tiles(CExpr('lo'), CExpr('end')))};",
            f"if (k_tiles <= 0) {skip};  // an empty group: nothing to add"))

    in_walk = item_lines("    ") if persistent else ""  # (a block's one item: decoded once, before the roles split)
    producer_item = f"""{in_walk}    if (bx == 0)  // E sorted (GROUPS:): each row of the group holds it (checked once a group)
      for ({it} r = lo + ptid; r < end; r += {loop.warpgroup_size}) habu::grouping_ok((long long){e_ptr}[r], (long long)g, {index_code(model, lw.groups)}u, (long long)r);
    {held_regs}
    {index_regs}for (long long kt = 0; kt < k_tiles; ++kt) {{
{loads}{index_read}        const habu::u32 full = {ring_barrier(ring, "stage")};
        habu::mbar_wait({ring_barrier(ring, "stage", empty=True)}, {c(ring.producer_wait(CExpr("phase")))});
        const habu::u32 a_stage = smem_base + {ops.stage_tile("A", 0)}u + (habu::u32)stage * {ops.stage_stride}u;
        const habu::u32 b_stage = smem_base + {ops.stage_tile("B", 0)}u + (habu::u32)stage * {ops.stage_stride}u;
{copies}{stores}        {arrive}
{index_stage}        {ring_advance_line(ring)}
{settle}      }}
"""
    consumer_item = f"""{in_walk}    float acc[{loop.slabs}][{regs}];
#pragma unroll
    for (int s = 0; s < {loop.slabs}; ++s)
#pragma unroll
      for (int i = 0; i < {regs}; ++i) acc[s][i] = 0.0f;
{consumer_k_loop(ring, ops, mma, "    ", before_wait, after_wait)}#pragma unroll
    for (int q = 0; q < {loop.slabs}; ++q)
#pragma unroll
      for (int h = 0; h < {frag.halves}; ++h) {{  // the rows lane/4 and lane/4 + 8 of each warp's 16
        const {it} m = ({it})({c(lw.column_m(CExpr("mt"), loop.acc_row(CExpr("cw"), CExpr("q")) + CExpr(frag.row_in_warpgroup())))});
#pragma unroll
        for (int rnd = 0; rnd < {loop.epilogue_rounds()}; ++rnd) {{  // {batch} column groups' prior values read at once, then added
          float2 prior[{batch}];
#pragma unroll
          for (int b = 0; b < {batch}; ++b) {{
{pair_lines}            if (in0) prior[b] = habu::read_owned({p_out} + at, in1 && (at & 1) == 0, in0, in1);
          }}
#pragma unroll
          for (int b = 0; b < {batch}; ++b) {{
{pair_lines}            if (in0) habu::write_owned({p_out} + at, make_float2(prior[b].x + {scale}acc[q][{v_reg[0]}], prior[b].y + {scale}acc[q][{v_reg[1]}]), in1 && (at & 1) == 0, in0, in1);
          }}
        }}
      }}
"""
    rounds = lw.search_rounds(search_rows)
    if persistent:
        first, bound, step = lw.walk(CExpr("blockIdx.x"), CExpr("gridDim.x"), CExpr("items"))
        offsets = (f"  // every group's offs[] once ({groups} groups and #{lw.r}), a warp each in turn\n"
                   f"  habu::group_offsets_warps<{it}, {rounds}>({e_ptr}, ({it})({rows}), {groups}, offs);\n")
        tiles_line = (f"  const long long tiles = {c(lw.tiles(sizes))};  // a group's output tiles\n"
                      f"  const long long items = {c(lw.work_items(sizes))};  // the work: every group's tiles\n")

        def walk(item: str) -> str:
            """The item's lines inside the persistent walk, two spaces deeper."""
            inner = "".join(line if line.startswith("#") or not line.strip() else "  " + line
                            for line in item.splitlines(keepends=True))
            return (f"    for (long long w = {c(first)}; w < {c(bound)}; w += {c(step)}) {{  // persistent: every item "
                    f"once, the ring running on\n{inner}    }}\n")
    else:
        targets = ", ".join(c(x) for x in lw.search_targets(CExpr("blockIdx.y"), groups))
        offsets = (f"  // offs[] of the block's group, the next, the first and the last ({groups} groups), a warp each\n"
                   f"  habu::group_offsets_warp<{it}, {rounds}>({e_ptr}, ({it})({rows}), {targets}, offs);\n")
        tiles_line = ""

        def walk(item: str) -> str:
            return item
    body = f"""{wgmma_function(k.bn, "bf16", *trans)}
{kernel_opening(name, loop.threads, ops, ring, it, groups, lw.r)}{GRID_LAUNCH}{GRID_WAIT}  const int tid = threadIdx.x;
  const int wg = {c(loop.warpgroup(CExpr("tid")))};
  // full[s] (+0): the producer's 128 threads stored the stage; empty[s] (+8): every consumer is done with it
  if (tid == 0) habu::ring_init(bars, {ring.stages}, {ring.full_arrivals}, {ring.empty_arrivals});
{offsets}  __syncthreads();
  if (tid == 0 && offs[0] > 0) {table.check(lw.groups, "0", groups)};  // a group below 0: raise the error flag
  if (tid == 0 && offs[{groups}] < ({it})({rows})) {table.check(lw.groups, f"offs[{groups}]", groups)};  // a group past #{lw.g}
  const {it} n_tiles = ({it})({c(lw.n_tiles(sizes))});
{tiles_line}{"" if persistent else item_lines("  ")}  int stage = {ring.start_stage};
  habu::u32 phase = {ring.start_phase};
  if (wg == 0) {{  // ---------------------------------------------------------------- producer
{dec}    const int ptid = {c(loop.producer_thread(CExpr("tid")))};
{walk(producer_item)}  }} else {{  // --------------------------------------------------------------------- consumers
{inc}    const int cw = {c(loop.consumer(CExpr("wg")))};
{ctid}
    const int lane = {frag.lane_of()};
    const int warp = {frag.warp_of()};
{walk(consumer_item)}  }}
}}
"""
    gathered = [acc.tensor for acc in (lw.a, lw.b) if any(p.kind == "gather" for p in acc.positions)]

    def moved(side: str) -> str:
        return "cp.async" if loop.copied_async(side) else "through registers"

    src = header(f"{name}: grouped weight gradient over #{lw.g} = {groups} groups, wgmma {k.bm}×{k.bn}×{ops.bk} "
                 f"(both operands MN-major), {ring.stages} stages, {loop.consumers} consumer warpgroup(s)",
                 [f"computes {lw.out.tensor}[g, m, n] += Σ over group g's rows of {lw.a.tensor} · {lw.b.tensor}",
                  f"{lw.a.tensor} ({lw.a.dtype}{', two bf16 parts' if loop.parts == 2 else ''}, {moved('A')}) and "
                  f"{lw.b.tensor} ({moved('B')}) by the producer{' (gathered: ' + ', '.join(gathered) + ')' if gathered else ''}, "
                  "rows masked at the group's end; offsets found on the device",
                  *([f"each row times {lw.row_scale.tensor}[r]"] if lw.row_scale is not None else []),
                  f"adds into {lw.out.tensor} (each element by the one block that owns it)"])
    src += body.replace("SIGNATURE", sig.declaration())
    return CudaKernel(name, src, tuple(sig.params), loop.threads, loop.smem_total, lw,
                      register_demand=split.demand if resized else None)  # no setmaxnreg: nothing to wait for


class HeldRowIndex(TableReader):
    """An index tensor read at the chunk's row `r` from the register the producer loaded it into a k tile ahead
    (`held[j]`, the chunk loop's j); its check (`habu::index_ok`) on that value, reported at row r."""

    def __init__(self, base: TableReader, held: str):
        super().__init__(base.sig, base.model, base.it)
        self.held = held

    def __call__(self, name: str, coordinate: str) -> str:
        return f"({self.it}){self.held}[j]" if coordinate == "r" else super().__call__(name, coordinate)

    def check(self, name: str, coordinate, size) -> str:
        if coordinate != "r":
            return super().check(name, coordinate, size)
        return (f"habu::index_ok((long long){self.held}[j], (long long)({c(size)}), {index_code(self.model, name)}u, "
                "(long long)(r))")


def convert_lines(lw: GroupedWgradLowering, sig: Signature, sizes: dict, table, it: str) -> tuple[str, str]:
    """The consumers' in-place pass over their slabs of a staged A (`WgradLoop.a_convert`), as the k loop's lines
    before the stage's wait (each chunk's row factor, loaded while the stage fills) and after it: each thread reads
    its chunks (`convert_source`) of each of its slabs (an f32 A's raw halves at `a_staged_offset`, a bf16 A at
    its slot), the warpgroup meets, each writes its chunks' bf16 parts (`a_store_offset`, times the row factor
    first), then fences them for wgmma and meets again."""
    loop = lw.loop
    assert loop is not None
    n = loop.convert_chunks()
    ki, mi = loop.convert_source(CExpr("ctid"), CExpr("j"))
    m = loop.acc_row(CExpr("cw"), CExpr("q")) + mi
    bar = "1 + cw"  # the warpgroup's named barrier (0 is __syncthreads)
    before = ""
    factor = ""
    if lw.row_scale is not None:
        rs = lw.row_scale
        value = load_value(rs.dtype, sig.pointer(rs.tensor, rs.dtype),
                           access_offset(rs, {"k": "r"}, sizes, lw.index_width, table))
        before = f"""  float cf[{n}];  // the row factor {rs.tensor}[r] of each chunk's row, loaded before the stage's wait
#pragma unroll
  for (int j = 0; j < {n}; ++j) {{
    const {it} r = ({it})({c(lw.row(CExpr("lo"), CExpr("kt"), ki))});
    cf[j] = {c(lw.row_inside(CExpr("r"), CExpr("end")))} ? {value} : 0.0f;
  }}
"""
    if loop.parts == 2:
        if lw.row_scale is not None:
            factor = "habu::scale_chunk(cx[j], cy[j], cf[j]); "
        reads = (f"      cx[j] = habu::load_shared_f32x4(a_stage + (habu::u32)({c(loop.a_staged_offset(m, ki, 0))}));\n"
                 f"      cy[j] = habu::load_shared_f32x4(a_stage + (habu::u32)({c(loop.a_staged_offset(m, ki, 1))}));\n")
        writes = (f"{factor}habu::store_split_bf16x8(a_stage + (habu::u32)({c(loop.a_store_offset(m, ki, 0))}), "
                  f"a_stage + (habu::u32)({c(loop.a_store_offset(m, ki, 1))}), cx[j], cy[j]);")
        regs, meet = f"float4 cx[{n}], cy[{n}];", f"    habu::slab_pass_sync({bar});  // every raw chunk read before a part lands on it\n"
    else:
        reads = f"      cv[j] = habu::load_shared16(a_stage + (habu::u32)({c(loop.a_store_offset(m, ki, 0))}));\n"
        writes = (f"habu::scale_chunk(cv[j], cf[j]); "
                  f"habu::store_shared16(a_stage + (habu::u32)({c(loop.a_store_offset(m, ki, 0))}), cv[j]);")
        regs, meet = f"uint4 cv[{n}];", ""  # each thread rewrites the chunks it read
    after = f"""#pragma unroll
  for (int q = 0; q < {loop.slabs}; ++q) {{  // A's slab q of this warpgroup, rewritten in place: row {c(ki)} of k, 8 columns from {c(mi)}
    {regs}
#pragma unroll
    for (int j = 0; j < {n}; ++j) {{
{reads}    }}
{meet}#pragma unroll
    for (int j = 0; j < {n}; ++j) {{ {writes} }}
  }}
  habu::fence_proxy_async();
  habu::slab_pass_sync({bar});  // the warpgroup's parts written and visible to its wgmmas
"""
    return before, after


def _persistent(lw: GroupedWgradLowering) -> bool:
    return lw.loop is not None and lw.loop.persistent


def _blocks(lw: GroupedWgradLowering, sizes, slots: int) -> tuple[int, int, int]:
    """(output tiles of a group, groups), or, persistent, the blocks resident at once (at most one a work item)."""
    if _persistent(lw):
        return (max(1, min(int(lw.work_items(sizes)), slots)), 1, 1)
    return GRID_2D.blocks(lw, sizes, slots)


def _formula(lw: GroupedWgradLowering, s, slots):
    if _persistent(lw):
        return (cmax(1, cmin(lw.work_items(s), slots)), "1", "1")
    return GRID_2D.formula(lw, s, slots)


register_geometry(GroupedWgradLowering, LaunchGeometry(
    blocks=_blocks, formula=_formula, slots=lambda lw, cluster: "sm_count" if _persistent(lw) else None))

__all__ = ["emit_grouped_wgrad"]
