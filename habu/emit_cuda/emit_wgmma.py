"""The Hopper contraction: a producer warpgroup fills a ring of shared-memory stages, consumer
warpgroups multiply with wgmma.

    warpgroup 0 (producer, 40 registers): for each k tile, wait until stage s is free, then fill it:
        TMA operands: one thread posts the byte count and issues the tensor-map loads;
        cp.async operands (gathered rows): all 128 threads copy 16-byte chunks into the swizzled layout;
        ldg operands (misaligned rows): all 128 threads load, store, fence the async proxy;
      every path completes on the stage's `full` mbarrier.
    warpgroups 1..C (consumers, 232 registers): wait for `full`, issue 4 wgmma k16 steps per 64-row
      slab, keep one group in flight, release the previous stage on its `empty` mbarrier; then the
      epilogue evaluates the fused nodes in registers and stores with the lowering's masks.

Tiles are K-major with rows of 128 bytes (BK = 64 two-byte elements) in the 128-byte swizzle that
TMA writes and wgmma reads; the other producers write the same pattern (`habu::swizzle128`). A B
stored contiguous along n (a (K, N) weight) is loaded by TMA as BN/64 boxes of 64 columns by BK rows,
each its own 128-byte-swizzled block, and wgmma reads the blocks with its transpose bit: no staging
copy to K-major.
"""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import (
    CTYPE,
    GRID_LAUNCH,
    GRID_WAIT,
    Signature,
    access_mask,
    access_offset,
    header,
    index_type,
)
from habu.emit_cuda.emit_fma import epilogue_pair_code, epilogue_value, table_reader, tile_setup
from habu.emit_cuda.kernel import CudaKernel, TmaSpec
from habu.emit_cuda.wgmma import wgmma_function, wgmma_name
from habu.lower.access import Access
from habu.lower.contraction import ContractionLowering
from habu.lower.layouts import SmemTile, StageCopy, WgmmaOperands
from habu.lower.registers import consumer_warpgroups, warp_specialized_split
from habu.lower.support import WGMMA, contraction_smem
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Model

MN_BLOCK = 64  # columns of an MN-major B box: one 128-byte swizzle span of 16-bit elements


def wgmma_layout(lw: ContractionLowering) -> tuple[int, int]:
    """(consumer warpgroups, 64-row slabs per consumer) of a warp-specialised wgmma kernel."""
    k = lw.kernel
    consumers = consumer_warpgroups(k.warps, k.warp_specialized)
    if k.warps < 8 or k.tile_m % (64 * consumers):
        raise ValueError(f"{k.warps} warps cannot split a {k.tile_m}-row tile into 64-row wgmma slabs")
    return consumers, k.tile_m // (64 * consumers)


def _producer_copy(side: str, lw: ContractionLowering, sig: Signature, sizes, it: str, model: Model,
                   move: str, vec: int, rows: int, row_axis: str) -> str:
    """C for 128 producer threads copying one operand tile into stage `stage` (non-TMA paths)."""
    access: Access = lw.a if side == "A" else lw.b
    e = DTYPES[access.dtype].bytes
    per_row = lw.bk // vec  # vectors per 128-byte row
    total = rows * per_row
    p = sig.pointer(access.tensor, access.dtype)
    table = table_reader(sig, model, it)
    coord = {row_axis: "r", "k": "kk"}
    off = access_offset(access, coord, sizes, lw.index_width, table)
    mask = access_mask(access, coord, sizes)
    base = f"{side.lower()}_stage"
    ops = lw.operands  # the stage tile's layout: habu/lower/layouts.py (the store map the field check runs)
    if isinstance(ops, WgmmaOperands):
        copy = ops.a_copy if side == "A" else ops.b_copy
    else:  # beside an MN-major B the lowering holds no maps yet: the same K-major layout, unchecked
        copy = StageCopy(lw.bk, rows, vec, True, SmemTile(rows, lw.bk, e, 128))

    def dst(x: str) -> str:
        return f"(habu::u32)({c(copy.byte_offset(CExpr('(habu::u32)i'), CExpr(f'(habu::u32)({x})')))})"

    if move == "cp.async":
        if 128 % per_row == 0:
            # each thread copies the same vector column of the same rows at every k step: their row
            # offsets (through the gather) were computed once per tile (`rows_setup`)
            step = 128 // per_row
            koff = access_offset(access, coord, sizes, lw.index_width, table, ("k",))
            kmask = " && ".join(f"(kk) {'<=' if b.inclusive else '<'} {c(sizes[b.extent])}"
                                for b in access.masks if b.axis == "k") or "true"
            return f"""        {{
          const {it} kk = k0 + (ptid % {per_row}) * {vec};
          const bool k_ok = {kmask};
#pragma unroll
          for (int j = 0; j < {total // 128}; ++j) {{
            const int i = ptid / {per_row} + {step} * j;
            const bool ok = {side.lower()}_row_off[j] >= 0 && k_ok;
            const {CTYPE[access.dtype]}* src = ok ? {p} + {side.lower()}_row_off[j] + ({koff}) : {p};
            habu::cp_async<{vec * e}>({base} + {dst(f"(ptid % {per_row}) * {vec}")}, src, ok);
          }}
        }}
"""
        return f"""        for (int e = ptid; e < {copy.count}; e += 128) {{
          const int i = {c(copy.along(CExpr("e"))[0])};
          const int v = e % {per_row};
          const {it} r = {row_axis}0 + i;
          const {it} kk = k0 + v * {vec};
          const bool ok = {mask};
          const {CTYPE[access.dtype]}* src = ok ? {p} + ({off}) : {p};
          habu::cp_async<{vec * e}>({base} + {dst(f"v * {vec}")}, src, ok);
        }}
"""
    # ldg: predicated scalar loads, stored into the swizzled layout
    row, col = copy.element(*copy.along(CExpr("e")))
    return f"""        for (int e = ptid; e < {copy.count}; e += 128) {{
          const int i = {c(row)};
          const int x = {c(col)};
          const {it} r = {row_axis}0 + i;
          const {it} kk = k0 + x;
          const bool ok = {mask};
          const unsigned short v = habu::load2_or_zero(ok ? (const void*)({p} + ({off})) : (const void*){p}, ok);
          *reinterpret_cast<unsigned short*>(smem + ({base} - smem_base) + {dst("x")}) = v;
        }}
"""


def _rows_setup(side: str, lw: ContractionLowering, sig: Signature, sizes, it: str, model: Model, vec: int,
                rows: int, row_axis: str) -> str:
    """Per tile, before the k loop: the row part of each cp.async source offset and its mask."""
    access: Access = lw.a if side == "A" else lw.b
    per_row = lw.bk // vec
    if 128 % per_row:
        return ""
    count = rows * per_row // 128
    table = table_reader(sig, model, it)
    roff = access_offset(access, {row_axis: "r", "k": "0"}, sizes, lw.index_width, table, (row_axis,))
    rmask = " && ".join(f"(r) {'<=' if b.inclusive else '<'} {c(sizes[b.extent])}"
                        for b in access.masks if b.axis == row_axis) or "true"
    s = side.lower()
    return f"""      {it} {s}_row_off[{count}];  // -1: the row is past the edge (masked)
#pragma unroll
      for (int j = 0; j < {count}; ++j) {{
        const {it} r = {row_axis}0 + ({it})(ptid / {per_row} + {128 // per_row} * j);
        {s}_row_off[j] = ({rmask}) ? ({roff}) : ({it})-1;
      }}
"""


def _tma_store_epilogue(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str, slabs: int,
                        consumers: int, off: dict[str, int]) -> str:
    """C for one consumer warpgroup's epilogue through shared memory: per 64-row slab, per box of one
    128-byte swizzle span of columns, the threads write their values (the fused epilogue applied)
    into one of two swizzled buffers, and one thread stores the box with TMA. The store runs while
    the warpgroup fills the other buffer, and the last ones while it starts its next tile; the
    tensor map's bounds clip the rows and columns past the output's edges."""
    out = lw.out
    e = DTYPES[out.dtype].bytes
    width = 128 // e
    bn = lw.bn
    if bn % width:
        raise ValueError(f"TMA stores write boxes of {width} columns: {bn} is not a multiple")
    out_map = sig.tensormap(TmaSpec(out.tensor, out.dtype, tuple(reversed(out.bounded_extents())), (width, 64), 128))
    base = off["E0.0"]
    other = off["E0.1"] - base
    per_wg = off["E1.0"] - base if consumers > 1 else 0
    if any(off[f"E{c}.{j}"] != base + c * per_wg + j * other for c in range(consumers) for j in (0, 1)):
        raise ValueError("epilogue buffers are not evenly spaced in shared memory")
    if out.dtype == "f32":
        put = "*reinterpret_cast<float2*>(dst) = make_float2(v0, v1);"
    else:
        pack = "habu::pack_bf16x2" if out.dtype == "bf16" else "habu::pack_f16x2"
        put = f"*reinterpret_cast<habu::u32*>(dst) = {pack}(v0, v1);"
    # the box's coordinates, innermost first, in the order of the output's positions (the rules
    # require [m, n]: the box holds rows of m, each a run of contiguous n)
    axis_origin = {"n": f"n0 + b * {width}", "m": f"m0 + (cw * {slabs} + s) * 64"}
    box_origin = ", ".join(f"(int)({axis_origin[p.axis]})" for p in reversed(out.positions))
    frag = lw.fragment
    v0 = epilogue_value(lw, sig, model, sizes, it, "m", "n", f"acc[s][{frag.register(0)}]")
    v1 = epilogue_value(lw, sig, model, sizes, it, "m", "(n + 1)", f"acc[s][{frag.register(1)}]")
    return f"""#pragma unroll
      for (int s = 0; s < {slabs}; ++s)
#pragma unroll
        for (int b = 0; b < {bn // width}; ++b) {{  // boxes of {width} columns
          const habu::u32 buf = smem_base + {base}u + (habu::u32)cw * {per_wg}u + (habu::u32)(boxes_stored & 1) * {other}u;
          if (boxes_stored >= 2 && threadIdx.x % 128 == 0) habu::bulk_wait_group_read<1>();  // buf's last store has read it
          habu::named_barrier_sync(1 + cw, 128);
#pragma unroll
          for (int jj = 0; jj < {width // 8}; ++jj)
#pragma unroll
            for (int h = 0; h < 2; ++h) {{  // each thread holds pairs of adjacent columns
              const int j = b * {width // 8} + jj;
              const int row = {frag.row_in_warpgroup()};
              const {it} m = m0 + ({it})((cw * {slabs} + s) * 64 + row);
              const {it} n = n0 + ({it})({frag.col()});
              const float v0 = {v0};
              const float v1 = {v1};
              const habu::u32 byte = (habu::u32)(({frag.col("jj")}) * {e});
              unsigned char* dst = smem + (buf - smem_base) + habu::swizzle128((habu::u32)row, byte >> 4) + (byte & 15u);
              {put}
            }}
          habu::fence_proxy_async();  // the threads' writes, visible to the TMA store
          habu::named_barrier_sync(1 + cw, 128);
          if (threadIdx.x % 128 == 0) {{
            habu::tma_store_2d(&{out_map}, buf, {box_origin});
            habu::bulk_commit_group();
          }}
          ++boxes_stored;
        }}
"""


def emit_wgmma(name: str, model: Model, lw: ContractionLowering, static: dict[str, int],
               early_main_loop: bool = False) -> CudaKernel:
    """`early_main_loop`: no earlier kernel of the plan writes what the main loop reads (the operands
    and their index tensors), so the kernel runs its main loop while the previous kernel may still be
    running, and its consumers wait for it (griddepcontrol.wait) only before each epilogue; otherwise
    every thread waits first."""
    k = lw.kernel
    if lw.a.dtype != lw.b.dtype or lw.a.dtype not in ("bf16", "f16"):
        raise ValueError("wgmma needs bf16 or f16 operands of one type")
    refused = WGMMA.own_refusals(lw)  # the rules' `supported-path` reads the same (habu/lower/support.py)
    if refused:
        raise ValueError(f"the wgmma path does not print this plan: {'; '.join(refused)}")
    # B contiguous along n (a (K, N) weight): TMA loads 64-column boxes, wgmma reads them transposed
    b_mn = lw.b.positions[-1].axis == "n"
    consumers, slabs = wgmma_layout(lw)
    threads = 128 * (consumers + 1)
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    layout = contraction_smem(k, lw.a.dtype, lw.b.dtype)
    bn, bm = lw.bn, lw.bm
    dtype = lw.a.dtype
    off = {b.name: b.offset for b in layout.buffers}
    stride = off["A1"] - off["A0"] if k.stages > 1 else 0
    if any(off[f"A{s}"] != off["A0"] + s * stride or off[f"B{s}"] != off["B0"] + s * stride for s in range(k.stages)):
        raise ValueError("stages are not evenly spaced in shared memory")
    # a staged operand is read from its aligned buffer with TMA
    moves = {side: ("tma" if m == "staged" else m) for side, m in (("A", k.a_move), ("B", k.b_move))}
    vecs = {"A": k.a_vector, "B": k.b_vector}
    if any(a.tensor.startswith("@") for a in (lw.a, lw.b)):
        pass  # staged buffers are pointers of the kernel like any tensor (Signature registers them)
    tma_bytes = sum((bm if s == "A" else bn) * 128 for s in "AB" if moves[s] == "tma")
    all_tma = all(m == "tma" for m in moves.values())
    full_count = 1 if all_tma else 128
    maps: dict[str, str] = {}
    cluster = k.cluster_m
    if cluster > 1 and (moves["B"] != "tma" or k.split_k > 1):
        raise ValueError("a cluster multicasts B's tile by TMA, without split-K")
    for side, acc, rows in (("A", lw.a, bm), ("B", lw.b, bn // cluster)):
        if moves[side] == "tma":
            dims = tuple(reversed(acc.bounded_extents()))  # TMA's zero fill past them is the access's mask
            box = (MN_BLOCK, lw.bk) if side == "B" and b_mn else (lw.bk, rows)
            ops = lw.operands  # a K-major tile: the tensor map writes the stage tile's swizzle
            swizzle = (ops.a_tile if side == "A" else ops.b_tile).swizzle if isinstance(ops, WgmmaOperands) else 128
            maps[side] = sig.tensormap(TmaSpec(acc.tensor, acc.dtype, dims, box, swizzle))
        elif moves[side] not in ("cp.async", "ldg"):
            raise ValueError(f"the wgmma emitter has no {moves[side]} producer")
    tma_issue = []
    everyone = (1 << cluster) - 1  # the multicast mask: every block of the cluster
    for side, rows_axis in (("A", "m0"), ("B", "n0")):
        if moves[side] == "tma" and side == "B" and cluster > 1 and b_mn:
            # block r loads the 64-column boxes j ≡ r (mod cluster) and multicasts them
            per = bn // MN_BLOCK // cluster
            tma_issue.append(f"for (int j = (int)crank; j < {bn // MN_BLOCK}; j += {cluster}) "
                             f"habu::tma_load_2d_multicast(b_stage + (habu::u32)j * {MN_BLOCK * 2 * lw.bk}u, "
                             f"&{maps[side]}, full, (int)(n0 + j * {MN_BLOCK}), (int)k0, {everyone});  "
                             f"// {per} box(es) per block")
        elif moves[side] == "tma" and side == "B" and cluster > 1:
            # block r loads rows [r·BN/c, (r+1)·BN/c) of B's tile and multicasts them
            part = bn // cluster
            tma_issue.append(f"habu::tma_load_2d_multicast(b_stage + crank * {part * 128}u, &{maps[side]}, full, "
                             f"(int)k0, (int)(n0 + crank * {part}), {everyone});")
        elif moves[side] == "tma" and side == "B" and b_mn:
            tma_issue += [f"habu::tma_load_2d(b_stage + {j * MN_BLOCK * 2 * lw.bk}u, &{maps[side]}, full, "
                          f"(int)(n0 + {j * MN_BLOCK}), (int)k0);" for j in range(bn // MN_BLOCK)]
        elif moves[side] == "tma":
            tma_issue.append(f"habu::tma_load_2d({side.lower()}_stage, &{maps[side]}, full, (int)k0, (int){rows_axis});")
    producer_copies = "".join(
        _producer_copy(side, lw, sig, sizes, it, model, moves[side], vecs[side] if moves[side] == "cp.async" else 1,
                       bm if side == "A" else bn, "m" if side == "A" else "n")
        for side in "AB" if moves[side] != "tma")
    rows_setup = "".join(
        _rows_setup(side, lw, sig, sizes, it, model, vecs[side], bm if side == "A" else bn, "m" if side == "A" else "n")
        for side in "AB" if moves[side] == "cp.async")
    if all_tma:
        producer_fill = f"""        if (ptid == 0) {{
          habu::mbar_arrive_expect_tx(full, {tma_bytes});
          {' '.join(tma_issue)}
        }}
"""
    else:
        expect = ""
        if tma_issue:
            expect = f"""        if (ptid == 0) {{
          habu::mbar_expect_tx(full, {tma_bytes});
          {' '.join(tma_issue)}
        }}
"""
        uses_cp = any(moves[s] == "cp.async" for s in "AB")
        arrive = ("habu::cp_async_arrive(full);" if uses_cp else "habu::fence_proxy_async(); habu::mbar_arrive(full);")
        if uses_cp and any(moves[s] == "ldg" for s in "AB"):
            arrive = "habu::fence_proxy_async(); habu::cp_async_arrive(full);"
        producer_fill = expect + producer_copies + f"        {arrive}\n"
    regs = bn // 2
    split = warp_specialized_split(k.warps)
    wg_fn = wgmma_function(bn, dtype, b_mn)
    # a k16 step is 32 bytes along a K-major row, or 16 rows of 128 bytes down an MN-major block
    ops = lw.operands  # K-major operands: descriptors from the lowering (habu/lower/layouts.py)
    if isinstance(ops, WgmmaOperands):
        def desc(d, base: str, start) -> str:
            row, k_part = start
            at = base + (f" + (habu::u32)({c(row)})" if not (isinstance(row, int) and row == 0) else "")
            return f"habu::wgmma_desc<{d.lbo}u, {d.sbo}u, {d.mode}u>({at} + {c(k_part)})"
        b_desc = desc(ops.b_desc, "b_stage", ops.b_start(CExpr("kk")))
        a_descs = [desc(ops.a_desc, "a_stage", ops.a_start(CExpr("cw"), s, CExpr("kk"))) for s in range(slabs)]
    else:  # an MN-major B in 64-column TMA boxes (its layout is the emitter's)
        b_desc = f"habu::wgmma_desc_sw128_mn(b_stage + kk * {16 * 128}, {MN_BLOCK * 2 * lw.bk}u)"
        a_descs = [f"habu::wgmma_desc_sw128(a_stage + (habu::u32)((cw * {slabs} + {s}) * 64 * 128) + kk * 32)"
                   for s in range(slabs)]
    slab_mma = "\n".join(
        f"""          {wgmma_name(bn, dtype, b_mn)}(acc[{s}], {a_descs[s]}, {b_desc}, 1);"""
        for s in range(slabs))
    if k.store == "tma":
        epilogue = _tma_store_epilogue(lw, sig, model, sizes, it, slabs, consumers, off)
        store_state = "    int boxes_stored = 0;  // TMA-store boxes this warpgroup has issued (two buffers in turn)\n"
        drain = "    if (threadIdx.x % 128 == 0) habu::bulk_wait_group<0>();  // the last boxes leave before the block exits\n"
    else:
        frag = lw.fragment
        epi = epilogue_pair_code(lw, sig, model, sizes, it, "m", "n", f"acc[s][{frag.register(0)}]",
                                 f"acc[s][{frag.register(1)}]")
        epilogue = f"""#pragma unroll
      for (int s = 0; s < {slabs}; ++s)
#pragma unroll
        for (int j = 0; j < {bn // 8}; ++j)
#pragma unroll
          for (int h = 0; h < 2; ++h) {{  // each thread holds pairs of adjacent columns
            const {it} m = m0 + ({it})((cw * {slabs} + s) * 64 + {frag.row_in_warpgroup()});
            const {it} n = n0 + ({it})({frag.col()});
            {epi}
          }}
"""
        store_state = drain = ""
    # the epilogue reads and writes what the plan's previous kernel may still be writing or reading
    epilogue_wait = "    " + GRID_WAIT if early_main_loop else ""
    if cluster > 1:
        # a stage is free again when the consumers of every block have read it: each block's
        # producer writes its part of B into all of them
        # (thread r of the warpgroup tells block r, in parallel)
        release = "habu::mbar_arrive_cluster(bars + 16 * held + 8, (habu::u32)(threadIdx.x % 128));"
        release_who = f"threadIdx.x % 128 < {cluster}"
        sync_start = "habu::cluster_sync();  // the peers' barriers are initialised before anyone multicasts"
        sync_end = "  habu::cluster_sync();  // no block leaves while a peer may still write its shared memory\n"
        attrs = f"__cluster_dims__({cluster}, 1, 1) "
        rank_decl = "    const habu::u32 crank = habu::cluster_ctarank();\n"
    else:
        release = "habu::mbar_arrive(bars + 16 * held + 8);"
        release_who = "threadIdx.x % 128 == 0"
        sync_start, sync_end, attrs, rank_decl = "__syncthreads();", "", "", ""
    body = f"""{wg_fn}
extern "C" __global__ void {attrs}__launch_bounds__({threads}, 1) {name}(SIGNATURE) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const habu::u32 raw_base = habu::smem_addr(smem_raw);
  const habu::u32 smem_base = (raw_base + 1023u) & ~1023u;  // 128-byte swizzled tiles need 1024-byte alignment
  unsigned char* smem = smem_raw + (smem_base - raw_base);
  const habu::u32 bars = smem_base + {off['bar']};
{GRID_LAUNCH}{"" if early_main_loop else GRID_WAIT}  const int wg = threadIdx.x / 128;
  const long long tiles = {c(lw.tiles(sizes))};
  if (threadIdx.x == 0) {{
    for (int s = 0; s < {k.stages}; ++s) {{
      habu::mbar_init(bars + 16 * s, {full_count});          // full: the stage holds a k tile
      habu::mbar_init(bars + 16 * s + 8, {consumers * cluster});      // empty: every consumer of the cluster is done
    }}
    habu::fence_barrier_init();
  }}
  {sync_start}
  // stage s: A at smem_base + {off['A0']} + s * {stride}, B at smem_base + {off['B0']} + s * {stride}
  int stage = 0;
  habu::u32 phase = 0;
  if (wg == 0) {{  // ---------------------------------------------------------------- producer
    habu::setmaxnreg_dec<{split.producer}>();
    const int ptid = threadIdx.x;
{rank_decl}    for (long long lin = blockIdx.x; lin < tiles; lin += gridDim.x) {{
{tile_setup(lw, sizes, it, "      ")}{rows_setup}      for (long long kt = kt_begin; kt < kt_end; ++kt) {{
        const {it} k0 = ({it}){c(lw.k_origin(CExpr('kt_begin'), CExpr('(kt - kt_begin)')))};
        const habu::u32 full = bars + 16 * stage;
        habu::mbar_wait(bars + 16 * stage + 8, phase ^ 1u);
        const habu::u32 a_stage = smem_base + {off['A0']}u + (habu::u32)stage * {stride}u;
        const habu::u32 b_stage = smem_base + {off['B0']}u + (habu::u32)stage * {stride}u;
{producer_fill}        if (++stage == {k.stages}) {{ stage = 0; phase ^= 1u; }}
      }}
    }}
  }} else {{  // --------------------------------------------------------------------- consumers
    habu::setmaxnreg_inc<{split.consumer}>();  // {split.describe()}
    const int cw = wg - 1;
    const int lane = threadIdx.x % 32;
    const int warp = (threadIdx.x % 128) / 32;
{store_state}    for (long long lin = blockIdx.x; lin < tiles; lin += gridDim.x) {{
{tile_setup(lw, sizes, it, "      ")}      float acc[{slabs}][{regs}];
#pragma unroll
      for (int s = 0; s < {slabs}; ++s)
#pragma unroll
        for (int i = 0; i < {regs}; ++i) acc[s][i] = 0.0f;
      int held = -1;  // the stage whose wgmma may still be reading it
      for (long long kt = kt_begin; kt < kt_end; ++kt) {{
        habu::mbar_wait(bars + 16 * stage, phase);
        const habu::u32 a_stage = smem_base + {off['A0']}u + (habu::u32)stage * {stride}u;
        const habu::u32 b_stage = smem_base + {off['B0']}u + (habu::u32)stage * {stride}u;
        habu::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {{
{slab_mma}
        }}
        habu::wgmma_commit();
        habu::wgmma_wait<1>();
        if (held >= 0 && {release_who}) {release}
        held = stage;
        if (++stage == {k.stages}) {{ stage = 0; phase ^= 1u; }}
      }}
      habu::wgmma_wait<0>();
      if (held >= 0 && {release_who}) {release}
{epilogue_wait}{epilogue}    }}
{drain}  }}
{sync_end}}}
"""
    src = header(f"{name}: warp-specialised wgmma contraction {bm}x{bn}x{lw.bk}, {k.stages} stages, "
                 f"{consumers} consumer warpgroup(s)",
                 [f"computes {', '.join(k.nodes)}; A by {k.a_move}, B by {k.b_move}; split_k={k.split_k}; "
                  f"index width {lw.index_width}"
                  + (f"; clusters of {cluster} blocks along m share B's tile by TMA multicast" if cluster > 1 else "")])
    src += body.replace("SIGNATURE", sig.declaration())
    zero = (lw.out.tensor,) if lw.split_mode == "atomic" else ()
    return CudaKernel(name, src, tuple(sig.params), threads, layout.total, lw, zero,
                      register_demand=split.demand, cluster=cluster)
