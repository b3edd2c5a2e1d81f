"""The Ampere contraction: mma.sync m16n8k16 fed by ldmatrix, operands staged by a multi-stage
cp.async pipeline (or predicated loads), for sm_80 and later.

Warps form a 2 × (warps/2) grid over the tile. Shared tiles keep the global contiguity: A as
[BM][BK+8] when k is contiguous in memory, [BK][BM+8] otherwise (an A stored [k m]); B as [BN][BK+8]
or [BK][BN+8]; the mn-contiguous ones are read with ldmatrix.trans into the same registers
(`habu.lower.fragments.OperandFragment`), never copied transposed. Rows are padded by 16 bytes so ldmatrix's eight row addresses fall in
different banks.

    prologue: fill stages 0..S-2
    for each k tile: wait for its stage, barrier, start loading tile kt+S-1 into the stage freed
    last iteration, then multiply the tile from shared memory.
"""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import (
    GRID_LAUNCH,
    GRID_WAIT,
    Signature,
    access_mask,
    access_offset,
    header,
    index_type,
)
from habu.emit_cuda.emit_fma import epilogue_pair_code, table_reader, tile_setup
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.contraction import ContractionLowering
from habu.lower.pipeline import CpAsyncRing
from habu.lower.staging import main_loop_move
from habu.lower.support import MMA_SYNC, lowering_smem
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Model


def _gather4_load(lw: ContractionLowering, sig: Signature, sizes, it: str, model: Model, stage_bytes: int) -> str:
    """sm_100a: one thread gathers A's rows four at a time with TMA; rows past #M get an out-of-bounds
    coordinate, which TMA fills with zeros (as it does the ragged k tail)."""
    from habu.emit_cuda.kernel import TmaSpec

    acc = lw.a
    tmap = sig.tensormap(TmaSpec(acc.tensor, acc.dtype, tuple(reversed(acc.bounded_extents())), (lw.bk, 1), 0))
    table = next(p.table for p in acc.positions if p.kind == "gather")
    ix = sig.pointer(table, model.tensor(table).dtype.name)  # type: ignore[union-attr]
    rows_total = sizes[acc.extents[0]]
    e = DTYPES[acc.dtype].bytes
    M = sizes[lw.m]
    rows = ", ".join(f"(m0 + 4 * g + {i} < {c(M)}) ? (int){ix}[m0 + 4 * g + {i}] : (int){c(rows_total)}"
                     for i in range(4))
    return f"""      if (threadIdx.x == 0) {{
        habu::mbar_arrive_expect_tx(s_bar + 8 * st, {lw.bm * lw.bk * e});
        for (int g = 0; g < {lw.bm // 4}; ++g) {{
          int rows[4] = {{{rows}}};
          habu::tma_gather4(s_a + (habu::u32)(st * {stage_bytes}) + (habu::u32)(g * 4 * {lw.bk * e}), &{tmap},
                            s_bar + 8 * st, (int)k0, rows[0], rows[1], rows[2], rows[3]);
        }}
      }}
"""


def _stage_load(side: str, lw: ContractionLowering, sig: Signature, sizes, it: str, model: Model,
                threads: int, k_major: bool, rows: int, row_axis: str, stage_bytes: int) -> str:
    k = lw.kernel
    access = lw.a if side == "A" else lw.b
    e = DTYPES[access.dtype].bytes
    move = main_loop_move(str(k.mma), str(k.a_move if side == "A" else k.b_move),
                          k.a_vector if side == "A" else k.b_vector, e)  # (a staged operand: its buffer's)
    if move == "tma-gather4":
        return _gather4_load(lw, sig, sizes, it, model, stage_bytes)
    ops = lw.operands
    assert ops is not None, "the mma.sync lowering holds its shared-memory operand maps"
    copy = ops.a_copy if side == "A" else ops.b_copy  # the store map (habu/lower/layouts.py)
    vec = copy.vector
    p = sig.pointer(access.tensor, access.dtype)
    table = table_reader(sig, model, it)
    coord = {row_axis: "r", "k": "kk"}
    off = access_offset(access, coord, sizes, lw.index_width, table)
    mask = access_mask(access, coord, sizes, table)
    row, col = copy.element(*copy.along(CExpr("e")))
    idx = (f"const int i = {c(row)}; const int x = {c(col)};" if copy.k_inner
           else f"const int x = {c(col)}; const int i = {c(row)};")
    pos = f"const {it} r = {row_axis}0 + i; const {it} kk = k0 + x;"
    smem_off = c(copy.byte_offset(CExpr("i"), CExpr("x")))
    total = copy.count
    dst = f"s_{side.lower()} + (habu::u32)(st * {stage_bytes}) + (habu::u32)({smem_off})"
    if move == "cp.async":
        put = f"habu::cp_async<{vec * e}>({dst}, ok ? (const void*)({p} + ({off})) : (const void*){p}, ok);"
    else:
        put = (f"*reinterpret_cast<unsigned short*>(smem + ({dst} - s_base)) = "
                f"habu::load2_or_zero(ok ? (const void*)({p} + ({off})) : (const void*){p}, ok);")
    return f"""      for (int e = threadIdx.x; e < {total}; e += {threads}) {{
        {idx}
        {pos}
        const bool ok = {mask};
        {put}
      }}
"""


def emit_mma(name: str, model: Model, lw: ContractionLowering, static: dict[str, int]) -> CudaKernel:
    k = lw.kernel
    dt = lw.a.dtype
    if dt != lw.b.dtype or dt not in ("bf16", "f16"):
        raise ValueError("mma.sync needs bf16 or f16 operands of one type")
    refused = MMA_SYNC.own_refusals(lw)  # the rules' `supported-path` reads the same (habu/lower/support.py)
    if refused:
        raise ValueError(f"the mma.sync path does not print this plan: {'; '.join(refused)}")
    b_kmajor = lw.b_kmajor
    ops = lw.operands
    if ops is None or k.stages < 2:
        raise ValueError(f"tile {lw.bm}x{lw.bn}x{lw.bk} does not split into m16n8k16 over {k.warps} warps")
    grid = ops.grid  # the warp grid, the stage tiles and their maps: habu/lower/layouts.py
    wm, wn = grid.along_m, k.warps // grid.along_m
    MI, NI = grid.warp_rows // 16, grid.warp_cols // 8
    threads = 32 * k.warps
    sig = Signature(model, static=static)
    sizes = sig.sizes()
    it = index_type(lw.index_width)
    layout = lowering_smem(lw)
    off = {b.name: b.offset for b in layout.buffers}
    stride = off["A1"] - off["A0"]  # stages are laid out A0 B0 A1 B1 ...
    gather4 = k.a_move == "tma-gather4"
    ring = lw.pipeline
    if not isinstance(ring, CpAsyncRing):
        raise ValueError("the mma.sync path runs a cp.async ring")
    load_a = _stage_load("A", lw, sig, sizes, it, model, threads, True, lw.bm, "m", stride)
    load_b = _stage_load("B", lw, sig, sizes, it, model, threads, b_kmajor, lw.bn, "n", stride)
    a_bytes = b_bytes = stride
    mma_fn = "habu::mma_bf16_16816" if dt == "bf16" else "habu::mma_f16_16816"
    # the read map: each lane's ldmatrix row address, from the lowering
    lanes = (CExpr("ks"), CExpr("lane"))
    a_read = c(ops.a_fragment(CExpr("wm_"), CExpr("mi"), *lanes))
    b_read = c(ops.b_fragment(CExpr("wn_"), CExpr("ni"), *lanes))
    b_fn = f"habu::ldmatrix_x{ops.b_read.matrices}{'_trans' if ops.b_read.trans else ''}"
    a_fn = f"habu::ldmatrix_x{ops.a_read.matrices}{'_trans' if ops.a_read.trans else ''}"
    b_frag = f"""{b_fn}(bf[ni], s_b + (habu::u32)(st * {b_bytes}) + (habu::u32)({b_read}));"""
    epi = epilogue_pair_code(lw, sig, model, sizes, it, "m", "n", f"acc[mi][ni][{lw.fragment.register_in_group(0)}]",
                             f"acc[mi][ni][{lw.fragment.register_in_group(1)}]")
    body = f"""extern "C" __global__ void __launch_bounds__({threads}) {name}(SIGNATURE) {{
{GRID_LAUNCH}{GRID_WAIT}  extern __shared__ __align__(128) unsigned char smem[];
  const habu::u32 s_base = habu::smem_addr(smem);
  const habu::u32 s_a = s_base + {off["A0"]}u;  // stage st of A at s_a + st * {stride}: [{ops.a_tile.rows}][{ops.a_tile.row_elems}]
  const habu::u32 s_b = s_base + {off["B0"]}u;  // stage st of B at s_b + st * {stride}
{f"  const habu::u32 s_bar = s_base + {layout.total}u;  // gather4: one mbarrier per stage" + chr(10) if gather4 else ""}{"  if (threadIdx.x == 0) { for (int s = 0; s < " + str(k.stages) + "; ++s) habu::mbar_init(s_bar + 8 * s, 1); habu::fence_barrier_init(); }" + chr(10) + "  __syncthreads();" if gather4 else ""}
  long long uses = 0;  // k tiles consumed so far (the parity of a stage's mbarrier)
  const int lane = {lw.fragment.lane_of()};
  const int warp = threadIdx.x / 32;
  const int wm_ = {c(grid.warp_m(CExpr("warp")))};
  const int wn_ = {c(grid.warp_n(CExpr("warp")))};
  const long long tiles = {c(lw.tiles(sizes))};
  for (long long lin = blockIdx.x; lin < tiles; lin += gridDim.x) {{
{tile_setup(lw, sizes, it)}    float acc[{MI}][{NI}][{lw.fragment.registers(1)}];
#pragma unroll
    for (int mi = 0; mi < {MI}; ++mi)
#pragma unroll
      for (int ni = 0; ni < {NI}; ++ni)
#pragma unroll
        for (int q = 0; q < {lw.fragment.registers(1)}; ++q) acc[mi][ni][q] = 0.0f;
    const long long steps = kt_end > kt_begin ? kt_end - kt_begin : 0;
    // prologue: the first {ring.prologue} k tiles
    for (int pst = 0; pst < {ring.prologue}; ++pst) {{
      const int st = (int){c(ring.stage(CExpr('(uses + pst)')))};  // stages continue across tiles (mbarrier parity)
      if (pst < steps) {{
        const {it} k0 = ({it}){c(lw.k_origin(CExpr('kt_begin'), CExpr('pst')))};
{load_a}{load_b}      }}
      habu::cp_async_commit();
    }}
    for (long long j = 0; j < steps; ++j) {{
      habu::cp_async_wait<{ring.wait_groups}>();
{"      habu::mbar_wait(s_bar + 8 * (int)((uses + j) % " + str(k.stages) + "), (habu::u32)(((uses + j) / " + str(k.stages) + ") & 1));" if gather4 else ""}
      __syncthreads();
      {{  // refill the stage the previous iteration finished with
        const long long jn = j + {ring.prologue};
        const int st = (int){c(ring.stage(CExpr('(uses + jn)')))};
        if (jn < steps) {{
          const {it} k0 = ({it}){c(lw.k_origin(CExpr('kt_begin'), CExpr('jn')))};
{load_a}{load_b}        }}
        habu::cp_async_commit();
      }}
      const int st = (int){c(ring.stage(CExpr('(uses + j)')))};
#pragma unroll
      for (int ks = 0; ks < {lw.bk // 16}; ++ks) {{
        habu::u32 af[{MI}][4];
        habu::u32 bf[{NI}][2];
#pragma unroll
        for (int mi = 0; mi < {MI}; ++mi)
          {a_fn}(af[mi], s_a + (habu::u32)(st * {a_bytes}) + (habu::u32)({a_read}));
#pragma unroll
        for (int ni = 0; ni < {NI}; ++ni)
          {b_frag}
#pragma unroll
        for (int mi = 0; mi < {MI}; ++mi)
#pragma unroll
          for (int ni = 0; ni < {NI}; ++ni) {mma_fn}(acc[mi][ni], af[mi], bf[ni]);
      }}
    }}
    habu::cp_async_wait<0>();
    __syncthreads();
    uses += steps;
#pragma unroll
    for (int mi = 0; mi < {MI}; ++mi)
#pragma unroll
      for (int ni = 0; ni < {NI}; ++ni)
#pragma unroll
        for (int h = 0; h < {lw.fragment.halves}; ++h) {{  // fragment rows lane/4 and lane/4 + 8, two adjacent columns each
          const {it} m = m0 + ({it})({c(grid.row_origin(CExpr("wm_")))} + mi * 16 + {lw.fragment.row_in_warp()});
          const {it} n = n0 + ({it})({c(grid.col_origin(CExpr("wn_")))} + ni * 8 + {lw.fragment.col_in_group()});
          {epi}
        }}
  }}
}}
"""
    src = header(f"{name}: mma.sync m16n8k16 contraction {lw.bm}x{lw.bn}x{lw.bk}, {k.stages} stages, "
                 f"{k.warps} warps ({wm}x{wn})",
                 [f"computes {', '.join(k.nodes)}; A by {k.a_move}{'' if lw.a_kmajor else ' (m-contiguous)'}, "
                  f"B by {k.b_move} "
                  f"({'k' if b_kmajor else 'n'}-contiguous); split_k={k.split_k}"])
    src += body.replace("SIGNATURE", sig.declaration())
    zero = (lw.out.tensor,) if lw.zeroed_output else ()  # a scatter-add keeps its prior contents
    return CudaKernel(name, src, tuple(sig.params), threads, layout.total + (8 * k.stages if gather4 else 0), lw, zero)
