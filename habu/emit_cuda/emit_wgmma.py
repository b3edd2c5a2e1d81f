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

from dataclasses import dataclass

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
    references,
)
from habu.emit_cuda.emit_column_epilogue import column_sum_workspaces
from habu.emit_cuda.emit_epilogue_early import early_declarations
from habu.emit_cuda.emit_fma import (
    epilogue_pair_code,
    table_reader,
    tile_setup,
)
from habu.emit_cuda.emit_split_cluster import cluster_split_epilogue
from habu.emit_cuda.emit_wgmma_extras import consumer_lag, epilogue_prefetch, warm_next
from habu.emit_cuda.emit_wgmma_store import tma_store_epilogue
from habu.emit_cuda.kernel import CudaKernel, TmaSpec
from habu.emit_cuda.wgmma import wgmma_function, wgmma_name
from habu.lower.access import Access
from habu.lower.contraction import ContractionLowering, tma_coordinates
from habu.lower.layouts import SmemTile, StageCopy, WgmmaOperands
from habu.lower.pipeline import MN_BLOCK, MbarrierRing
from habu.lower.registers import consumer_warpgroups, warp_specialized_split
from habu.lower.support import WGMMA, lowering_smem
from habu.lower.tma_maps import operand_map
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Model


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
    mask = access_mask(access, coord, sizes, table)
    base = f"{side.lower()}_stage"
    ops = lw.operands  # the stage tile's layout: habu/lower/layouts.py (the store map the field check runs)
    if isinstance(ops, WgmmaOperands):
        copy = ops.a_copy if side == "A" else ops.b_copy
    else:  # beside an MN-major B the lowering holds no maps yet: the same K-major layout, unchecked
        copy = StageCopy(lw.bk, rows, vec, True, SmemTile(rows, lw.bk, e, 128))

    def dst(x: str) -> str:
        return f"(habu::u32)({c(copy.byte_offset(CExpr('(habu::u32)i'), CExpr(f'(habu::u32)({x})')))})"

    if move == "cp.async":
        spans = lw.bk * e // 128  # a k tile of several 128-byte spans: the same rows' vectors, span after span
        if spans > 1 and 128 % (per_row // spans) == 0 and per_row % spans == 0:
            per_span = per_row // spans  # vectors per 128-byte span of a row
            step = 128 // per_span
            koff = access_offset(access, coord, sizes, lw.index_width, table, ("k",))
            kmask = access_mask(access.along("k"), {"k": "kk"}, sizes, table)
            column = f"ks * {per_span * vec} + (ptid % {per_span}) * {vec}"
            return f"""#pragma unroll
        for (int ks = 0; ks < {spans}; ++ks) {{  // each span's vectors of the thread's rows
          const {it} kk = k0 + {column};
          const bool k_ok = {kmask};
#pragma unroll
          for (int j = 0; j < {rows * per_span // 128}; ++j) {{
            const int i = ptid / {per_span} + {step} * j;
            const bool ok = {side.lower()}_row_off[j] >= 0 && k_ok;
            const {CTYPE[access.dtype]}* src = ok ? {p} + {side.lower()}_row_off[j] + ({koff}) : {p};
            habu::cp_async<{vec * e}>({base} + {dst(column)}, src, ok);
          }}
        }}
"""
        if 128 % per_row == 0:
            # each thread copies the same vector column of the same rows at every k step: their row
            # offsets (through the gather) were computed once per tile (`rows_setup`)
            step = 128 // per_row
            koff = access_offset(access, coord, sizes, lw.index_width, table, ("k",))
            kmask = access_mask(access.along("k"), {"k": "kk"}, sizes, table)
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
    spans = lw.bk * DTYPES[access.dtype].bytes // 128
    if spans > 1 and per_row % spans == 0 and 128 % (per_row // spans) == 0:
        per_row //= spans  # the copies take a k tile of several spans span by span (`_producer_copy`)
    if 128 % per_row:
        return ""
    count = rows * per_row // 128
    table = table_reader(sig, model, it)
    roff = access_offset(access, {row_axis: "r", "k": "0"}, sizes, lw.index_width, table, (row_axis, *lw.batch_axes))
    rmask = access_mask(access.along(row_axis), {row_axis: "r"}, sizes, table)  # the gather's index check too
    s = side.lower()
    return f"""      {it} {s}_row_off[{count}];  // -1: the row is past the edge (masked)
#pragma unroll
      for (int j = 0; j < {count}; ++j) {{
        const {it} r = {row_axis}0 + ({it})(ptid / {per_row} + {128 // per_row} * j);
        {s}_row_off[j] = ({rmask}) ? ({roff}) : ({it})-1;
      }}
"""


@dataclass(frozen=True)
class _Kernel:
    """What the pieces of one wgmma kernel share: the lowering, its ring, the signature and layout."""

    name: str
    model: Model
    lw: ContractionLowering
    ring: MbarrierRing
    sig: Signature
    sizes: dict
    it: str  # the index type
    off: dict[str, int]  # shared-memory buffer offsets
    stride: int  # bytes from one stage to the next
    moves: dict[str, str]  # "tma", "cp.async" or "ldg" per operand
    consumers: int
    slabs: int
    maps: dict[str, str]  # the tensor map of each TMA operand

    def stage_base(self, side: str, stage: str) -> str:
        ops = self.lw.operands  # K-major operands: the stage tiles' offsets are the lowering's
        if isinstance(ops, WgmmaOperands):
            return f"smem_base + {ops.stage_tile(side, 0)}u + (habu::u32){stage} * {ops.stage_stride}u"
        return f"smem_base + {self.off[side + '0']}u + (habu::u32){stage} * {self.stride}u"


def _tma_issue(kc: _Kernel, sides: str = "AB") -> list[str]:
    """The TMA loads of one k tile (of the operands `sides`), from the ring's boxes: each box's shared-memory
    offset, its origin (the k coordinate of the tile, the row of the box) and, in a cluster, the boxes
    this block issues and the blocks they land in."""
    out = []
    for ld in kc.ring.loads:
        if ld.side not in sides:
            continue
        k = ld.k_coordinate(CExpr("kt_begin"), CExpr("(kt - kt_begin)"))
        tmap, dst, row0 = kc.maps[ld.side], f"{ld.side.lower()}_stage", CExpr(f"{'m' if ld.side == 'A' else 'n'}0")
        access, row_axis = (kc.lw.a, "m") if ld.side == "A" else (kc.lw.b, "n")
        load = f"tma_load_{len(access.positions)}d"  # a batched operand's map has its batch dimensions too

        def coords(box, ld=ld, k=k, row0=row0, access=access, row_axis=row_axis) -> str:
            first = ld.origin(row0, k, box)
            row, kk = first if ld.mn_major else (first[1], first[0])
            by_axis = {row_axis: row, "k": kk, **{a: CExpr(a) for a in kc.lw.batch_axes}}
            return ", ".join(f"(int){c(x)}" for x in tma_coordinates(access, by_axis))

        if ld.mask and ld.boxes == ld.cluster:  # block r issues box r
            out.append(f"habu::{load}_multicast({dst} + crank * {ld.box_bytes}u, &{tmap}, full, "
                       f"{coords(CExpr('crank'))}, {ld.mask});")
        elif ld.mask:  # block r issues the boxes j ≡ r (mod cluster)
            out.append(f"for (int j = (int)crank; j < {ld.boxes}; j += {ld.cluster}) "
                       f"habu::{load}_multicast({dst} + (habu::u32)j * {ld.box_bytes}u, &{tmap}, full, "
                       f"{coords(CExpr('j'))}, {ld.mask});  // {ld.boxes // ld.cluster} box(es) per block")
        else:
            hinted, policy = ("_hinted", f", habu::l2_policy_{ld.l2_hint}()") if ld.l2_hint else ("", "")
            out += [f"habu::{load}{hinted}({dst}{f' + {ld.landing(j)}u' if ld.landing(j) else ''}, &{tmap}, full, "
                    f"{coords(j)}{policy});" for j in range(ld.boxes)]  # (the L2 policy: `keep_operands`, `stream_b`)
    return out


def _producer_fill(kc: _Kernel, vecs: dict[str, int]) -> str:
    """C for the producer's fill of one stage: the TMA boxes with their expected bytes, the threads'
    copies of the other operands, and the arrivals completing the stage's `full` phase."""
    lw, ring, moves = kc.lw, kc.ring, kc.moves
    issue = " ".join(_tma_issue(kc))
    ahead, behind = ring.ahead_side, ring.behind_side
    if ring.producer_arrivals == 1 and ring.ahead:  # one operand went ahead for the tile's first k tiles: the rest
        return f"""        if (ptid == 0) {{
          if (kt < kt_ahead) {{  // {ahead}'s boxes are in flight: {behind}'s bytes, the arrival
            habu::mbar_arrive_expect_tx(full, {ring.expect_tx - ring.ahead_bytes});
            {" ".join(_tma_issue(kc, behind))}
          }} else {{
            habu::mbar_arrive_expect_tx(full, {ring.expect_tx});
            {issue}
          }}
        }}
"""
    if ring.producer_arrivals == 1:  # TMA only: one thread posts the bytes and arrives
        return f"""        if (ptid == 0) {{
          habu::mbar_arrive_expect_tx(full, {ring.expect_tx});
          {issue}
        }}
"""
    if ring.ahead and ring.expect_tx != ring.ahead_bytes:
        raise ValueError(f"{ahead} ahead beside copies: the TMA boxes are {ahead}'s alone")
    note = f"  // (before kt_ahead {ahead} went ahead)" if ring.ahead else ""
    expect = f"""        if (ptid == 0{" && kt >= kt_ahead" if ring.ahead else ""}) {{{note}
          habu::mbar_expect_tx(full, {ring.expect_tx});
          {issue}
        }}
""" if ring.loads else ""
    copies = "".join(
        _producer_copy(side, lw, kc.sig, kc.sizes, kc.it, kc.model, moves[side],
                       vecs[side] if moves[side] == "cp.async" else 1, lw.bm if side == "A" else lw.bn,
                       "m" if side == "A" else "n")
        for side in "AB" if moves[side] != "tma")
    uses_cp = any(moves[s] == "cp.async" for s in "AB")
    arrive = "habu::cp_async_arrive(full);" if uses_cp else "habu::fence_proxy_async(); habu::mbar_arrive(full);"
    if uses_cp and any(moves[s] == "ldg" for s in "AB"):
        arrive = "habu::fence_proxy_async(); habu::cp_async_arrive(full);"
    return expect + copies + f"        {arrive}\n"


def _ahead(kc: _Kernel, grid_wait: bool) -> str:
    """B ahead (`MbarrierRing.ahead`; A's boxes where `ahead_side` says): B's boxes of the tile's first k tiles,
    each stage's `empty` phase waited and B's bytes posted, from a copy of the ring's state; then the wait for
    the plan's previous kernel (where the producer's reads need it: A, its row table) and the k loop, which
    gives those tiles the rest of their fill. B is read before that wait only where no kernel of the plan
    writes it."""
    ring = kc.ring
    side = ring.ahead_side
    written = _written(kc, side)
    wait = "      habu::grid_dependency_wait();  // what the plan's earlier kernels wrote is visible from here\n"
    start = ring.ahead_start(CExpr("stage"), CExpr("phase"))
    return f"""{wait if grid_wait and written else ""}      // {side}'s boxes of the tile's first {ring.ahead} k tiles first: the weights stream from the start
      const long long kt_ahead = kt_end < kt_begin + {ring.ahead} ? kt_end : kt_begin + {ring.ahead};
      {{
        int stage_ahead = {c(start[0])};
        habu::u32 phase_ahead = {c(start[1])};
        for (long long kt = kt_begin; kt < kt_ahead; ++kt) {{
          const habu::u32 full = {ring_barrier(ring, "stage_ahead")};
          habu::mbar_wait({ring_barrier(ring, "stage_ahead", empty=True)}, {c(ring.producer_wait(CExpr('phase_ahead')))});
          const habu::u32 {side.lower()}_stage = {kc.stage_base(side, "stage_ahead")};
          if (ptid == 0) {{
            habu::mbar_expect_tx(full, {ring.ahead_bytes});
            {" ".join(_tma_issue(kc, side))}
          }}
          {ring_advance_line(ring).replace("(stage, phase)", "(stage_ahead, phase_ahead)")}
        }}
      }}
{wait if grid_wait and not written else ""}"""


def _written(kc: _Kernel, side: str) -> bool:
    """Whether operand `side` (or a table it is gathered by) may be written by an earlier kernel of the plan:
    anything but the model's own inputs, read in place."""
    inputs = {t.name for t in kc.model.inputs}
    acc = kc.lw.a if side == "A" else kc.lw.b
    move = kc.lw.kernel.a_move if side == "A" else kc.lw.kernel.b_move
    return acc.tensor not in inputs or any(p.table not in inputs for p in acc.positions if p.kind == "gather") \
        or move == "staged"


def _producer(kc: _Kernel, vecs: dict[str, int], producer_regs: int, grid_wait: bool = False) -> str:
    """The producer warpgroup: for each k tile of each of its tiles, wait until the ring's stage is
    free (the `empty` phase the lowering names), then fill it. `grid_wait`: the producer waits for the
    plan's previous kernel itself (B ahead: after B's first boxes, where no earlier kernel writes B)."""
    lw, ring = kc.lw, kc.ring
    fill = _producer_fill(kc, vecs)  # (registers the copies' pointers before the row offsets' tables)
    rows_setup = "".join(
        _rows_setup(side, lw, kc.sig, kc.sizes, kc.it, kc.model, vecs[side], lw.bm if side == "A" else lw.bn,
                    "m" if side == "A" else "n")
        for side in "AB" if kc.moves[side] == "cp.async")
    rank = "    const habu::u32 crank = habu::cluster_ctarank();\n" if ring.cluster > 1 else ""
    end = ("    habu::cluster_sync();  // the consumers' partials are in shared memory (cluster split)\n"
           "    habu::cluster_sync();  // the peers have read them\n" if lw.cluster_split else "")
    k0 = (f"        const {kc.it} k0 = ({kc.it}){c(lw.k_origin(CExpr('kt_begin'), CExpr('(kt - kt_begin)')))};\n"
          if references(fill, "k0") else "")  # (TMA copies print their coordinates whole)
    ahead = _ahead(kc, grid_wait) if ring.ahead else (GRID_WAIT.replace("  ", "    ", 1) if grid_wait else "")
    return f"""  if (wg == 0) {{  // ---------------------------------------------------------------- producer
    habu::setmaxnreg_dec<{producer_regs}>();
    const int ptid = threadIdx.x;
{rank}    for (long long lin = blockIdx.x; lin < tiles; lin += gridDim.x) {{
{tile_setup(lw, kc.sizes, kc.it, "      ")}{ahead}{rows_setup}{epilogue_prefetch(kc)}      for (long long kt = kt_begin; kt < kt_end; ++kt) {{
{k0}        const habu::u32 full = {ring_barrier(ring, "stage")};
        habu::mbar_wait({ring_barrier(ring, "stage", empty=True)}, {c(ring.producer_wait(CExpr('phase')))});
        const habu::u32 a_stage = {kc.stage_base("A", "stage")};
        const habu::u32 b_stage = {kc.stage_base("B", "stage")};
{fill}        {ring_advance_line(ring)}
      }}
    }}
{warm_next(kc)}{end}"""


def ring_advance_line(ring: MbarrierRing) -> str:
    """The ring's state update after a k tile, as the lowering gives it (`MbarrierRing.advance`)."""
    flip = f", {ring.flip}u" if ring.flip != 1 else ""
    return f"habu::ring_advance<{ring.wrap}{flip}>(stage, phase);"


def ring_barrier(ring: MbarrierRing, stage: str, empty: bool = False) -> str:
    """The address of a stage's full (or empty) barrier, from the ring's barrier slots
    (`MbarrierRing.full_barrier`, `empty_barrier`: bars + barrier_stride·stage [+ empty_offset])."""
    return f"bars + {ring.barrier_stride} * {stage}" + (f" + {ring.empty_offset}" if empty else "")


def _release(ring: MbarrierRing) -> str:
    """A consumer warpgroup frees stage `held`: one arrival on its `empty` barrier in every block of
    the cluster (thread r of the warpgroup tells block r, in parallel), whose producers all write it."""
    if ring.cluster > 1:
        return (f"if (held >= 0 && threadIdx.x % 128 < {ring.cluster}) "
                f"habu::mbar_arrive_cluster({ring_barrier(ring, 'held', empty=True)}, (habu::u32)(threadIdx.x % 128));")
    return f"if (held >= 0 && threadIdx.x % 128 == 0) habu::mbar_arrive({ring_barrier(ring, 'held', empty=True)});"


def _a_desc(ops: WgmmaOperands, desc, slabs: int, s: int) -> str:
    """The descriptor of A's slab s (of warpgroup cw) at k step kk, from the lowering (`a_desc`, `a_start`)."""
    d = ops.a_desc
    if d.mn_major and d.sbo == 8 * 128 and d.swizzle == 128:  # the device header's spelling of the same bits
        slab_bytes, k_bytes = ops.a_start(0, 1, 0)[0] - ops.a_start(0, 0, 0)[0], ops.a_start(0, 0, 1)[1]
        return (f"habu::wgmma_desc_sw128_mn(a_stage + (habu::u32)((cw * {slabs} + {s}) * {slab_bytes}) "
                f"+ kk * {k_bytes}, {d.lbo}u)")
    return desc(d, "a_stage", ops.a_start(CExpr("cw"), s, CExpr("kk")))


def _consumer_loop(kc: _Kernel) -> str:
    """One consumer warpgroup's k loop over a tile: wait for the stage's `full` phase, issue the
    wgmma k16 steps of each slab, keep one group in flight, release the stage read before."""
    lw, ring = kc.lw, kc.ring
    b_mn = lw.b.positions[-1].axis == "n"
    a_mn = lw.a.positions[-1].axis == "m"  # A stored [k m]: MN-major boxes, read with the transpose bit
    dtype = lw.a.dtype
    # a k16 step is 32 bytes along a K-major row, or 16 rows of 128 bytes down an MN-major block
    ops = lw.operands  # the descriptors from the lowering (habu/lower/layouts.py)
    if isinstance(ops, WgmmaOperands):
        def desc(d, base: str, start) -> str:
            row, k_part = start
            at = base + (f" + (habu::u32)({c(row)})" if not (isinstance(row, int) and row == 0) else "")
            return f"habu::wgmma_desc<{d.lbo}u, {d.sbo}u, {d.mode}u>({at} + {c(k_part)})"
        d = ops.b_desc
        if d.mn_major and d.sbo == 8 * 128 and d.swizzle == 128:  # the device header's spelling of the same bits
            b_desc = f"habu::wgmma_desc_sw128_mn(b_stage + kk * {ops.b_start(1)[1]}, {d.lbo}u)"
        else:
            b_desc = desc(d, "b_stage", ops.b_start(CExpr("kk")))
        a_descs = [_a_desc(ops, desc, kc.slabs, s) for s in range(kc.slabs)]
    else:  # no maps in the lowering (a plan the path's operand maps do not cover): the emitter's layout
        b_desc = (f"habu::wgmma_desc_sw128_mn(b_stage + kk * {16 * 128}, {MN_BLOCK * 2 * lw.bk}u)" if b_mn
                  else "habu::wgmma_desc_sw128(b_stage + kk * 32)")
        # an MN-major A: slab s of 64 rows is box (cw·slabs + s) of 64 columns of m by BK rows of k
        a_descs = [f"habu::wgmma_desc_sw128_mn(a_stage + (habu::u32)((cw * {kc.slabs} + {s}) * {MN_BLOCK * 2 * lw.bk}) "
                   f"+ kk * {16 * 128}, {MN_BLOCK * 2 * lw.bk}u)" if a_mn else
                   f"habu::wgmma_desc_sw128(a_stage + (habu::u32)((cw * {kc.slabs} + {s}) * 64 * 128) + kk * 32)"
                   for s in range(kc.slabs)]
    slab_mma = "\n".join(
        f"""          {wgmma_name(lw.bn, dtype, b_mn, a_mn)}(acc[{s}], {a_descs[s]}, {b_desc}, 1);"""
        for s in range(kc.slabs))
    slot = c(ring.read_slot(CExpr("stage")))
    lag_wait, lag_arrive, lag_none = consumer_lag(kc)
    return f"""      int held = -1;  // the stage whose wgmma may still be reading it
{lag_wait}      for (long long kt = kt_begin; kt < kt_end; ++kt) {{
        habu::mbar_wait({ring_barrier(ring, "stage")}, {c(ring.consumer_wait(CExpr('phase')))});
        const habu::u32 a_stage = {kc.stage_base("A", slot)};
        const habu::u32 b_stage = {kc.stage_base("B", slot)};
        habu::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < {ops.k_steps if isinstance(ops, WgmmaOperands) else 4}; ++kk) {{
{slab_mma}
        }}
        habu::wgmma_commit();
        habu::wgmma_wait<1>();
        {_release(ring)}
        held = {slot};
        {ring_advance_line(ring)}{lag_arrive}
      }}{lag_none}
      habu::wgmma_wait<0>();
      {_release(ring)}
"""


def _direct_epilogue(kc: _Kernel) -> str:
    """Each consumer thread stores its accumulator pairs (the fused epilogue applied) with the masks."""
    lw, frag = kc.lw, kc.lw.fragment
    epi = epilogue_pair_code(lw, kc.sig, kc.model, kc.sizes, kc.it, "m", "n", f"acc[s][{frag.register(0)}]",
                             f"acc[s][{frag.register(1)}]")
    return f"""#pragma unroll
      for (int s = 0; s < {kc.slabs}; ++s)
#pragma unroll
        for (int j = 0; j < {lw.bn // 8}; ++j)
#pragma unroll
          for (int h = 0; h < {frag.halves}; ++h) {{  // each thread holds pairs of adjacent columns
            const {kc.it} m = m0 + ({kc.it})((cw * {kc.slabs} + s) * 64 + {frag.row_in_warpgroup()});
            const {kc.it} n = n0 + ({kc.it})({frag.col()});
            {epi}
          }}
"""


def _consumers(kc: _Kernel, split, early_main_loop: bool, grid_wait: bool = False) -> str:
    """The consumer warpgroups: per tile, zero the accumulators, run the k loop, then the epilogue.
    `grid_wait`: they wait for the plan's previous kernel first (the kernel's start does not)."""
    lw = kc.lw
    frag = lw.fragment  # the thread decode of the accumulator's lanes and warps
    if lw.kernel.store == "tma":
        epilogue = tma_store_epilogue(lw, kc.sig, kc.model, kc.sizes, kc.it)
        store_state = "    int boxes_stored = 0;  // TMA-store boxes this warpgroup has issued (two buffers in turn)\n"
        drain = "    if (threadIdx.x % 128 == 0) habu::bulk_wait_group<0>();  // the last boxes leave before the block exits\n"
    elif lw.cluster_split:
        epilogue, store_state, drain = cluster_split_epilogue(lw, kc.sig, kc.model, kc.sizes, kc.it, kc.slabs,
                                                              kc.consumers), "", ""
    else:
        epilogue, store_state, drain = _direct_epilogue(kc), "", ""
    # the epilogue reads and writes what the plan's previous kernel may still be writing or reading
    epilogue_wait = "    " + GRID_WAIT if early_main_loop else ""
    regs = lw.fragment.registers(lw.bn // 8)  # the accumulator's registers per slab (fragment_mismatch checks them)
    return f"""  }} else {{  // --------------------------------------------------------------------- consumers
    habu::setmaxnreg_inc<{split.consumer}>();  // {split.describe()}
{GRID_WAIT.replace("  ", "    ", 1) if grid_wait else ""}    const int cw = wg - 1;
    const int lane = {frag.lane_of()};
    const int warp = {frag.warp_of()};
{store_state}    for (long long lin = blockIdx.x; lin < tiles; lin += gridDim.x) {{
{tile_setup(lw, kc.sizes, kc.it, "      ")}{early_declarations(lw, kc.sig, kc.model, kc.sizes, kc.it)}      float acc[{kc.slabs}][{regs}];
#pragma unroll
      for (int s = 0; s < {kc.slabs}; ++s)
#pragma unroll
        for (int i = 0; i < {regs}; ++i) acc[s][i] = 0.0f;
{_consumer_loop(kc)}{epilogue_wait}{epilogue}    }}
{drain}  }}
"""


def _setup(kc: _Kernel, early_main_loop: bool, generic_smem: bool = True) -> str:
    """The kernel's start: the aligned shared memory, the ring's barriers (with the arrival counts
    the lowering gives) and, in a cluster, the barrier that makes them visible to the peers.
    `generic_smem`: the rest of the kernel writes shared memory through the generic pointer `smem`."""
    ring = kc.ring
    ops = kc.lw.operands  # the base alignment the stage tiles' swizzle needs: the lowering's
    align = ops.base_align if isinstance(ops, WgmmaOperands) else 1024
    sync = ("habu::cluster_sync();  // the peers' barriers are initialised before anyone multicasts"
            if ring.cluster > 1 else "__syncthreads();")
    return f"""  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const habu::u32 raw_base = habu::smem_addr(smem_raw);
  const habu::u32 smem_base = (raw_base + {align - 1}u) & ~{align - 1}u;  // 128-byte swizzled tiles need 1024-byte alignment
{"  unsigned char* smem = smem_raw + (smem_base - raw_base);" + chr(10) if generic_smem else ""}  const habu::u32 bars = smem_base + {ring.base};
{GRID_LAUNCH}{"" if early_main_loop or ring.ahead else GRID_WAIT}  const int wg = threadIdx.x / 128;
  const long long tiles = {c(kc.lw.tiles(kc.sizes))};
  // full[s] (+0): the stage holds a k tile; empty[s] (+8): every consumer of the cluster is done with it
  if (threadIdx.x == 0) habu::ring_init(bars, {ring.stages}, {ring.full_arrivals}, {ring.empty_arrivals});
  {sync}
  // stage s: A at smem_base + {kc.off['A0']} + s * {kc.stride}, B at smem_base + {kc.off['B0']} + s * {kc.stride}
  int stage = {ring.start_stage};
  habu::u32 phase = {ring.start_phase};
"""


def _prepare(name: str, model: Model, lw: ContractionLowering, static: dict[str, int]) -> _Kernel:
    """Check the plan is one this emitter prints and gather what its pieces share."""
    k = lw.kernel
    if lw.a.dtype != lw.b.dtype or lw.a.dtype not in ("bf16", "f16"):
        raise ValueError("wgmma needs bf16 or f16 operands of one type")
    refused = WGMMA.own_refusals(lw)  # the rules' `supported-path` reads the same (habu/lower/support.py)
    if refused:
        raise ValueError(f"the wgmma path does not print this plan: {'; '.join(refused)}")
    if not isinstance(lw.pipeline, MbarrierRing):
        raise ValueError("the wgmma path runs an mbarrier ring")
    consumers, slabs = wgmma_layout(lw)
    if isinstance(lw.operands, WgmmaOperands):  # the slabs each consumer multiplies: the lowering's
        slabs = lw.operands.slabs
    sig = Signature(model, static=static)
    layout = lowering_smem(lw)
    off = {b.name: b.offset for b in layout.buffers}
    stride = off["A1"] - off["A0"] if k.stages > 1 else 0
    if any(off[f"A{s}"] != off["A0"] + s * stride or off[f"B{s}"] != off["B0"] + s * stride for s in range(k.stages)):
        raise ValueError("stages are not evenly spaced in shared memory")
    # a staged operand is read from its aligned buffer with TMA
    moves = {side: ("tma" if m == "staged" else str(m)) for side, m in (("A", k.a_move), ("B", k.b_move))}
    if k.cluster_m > 1 and (moves["B"] != "tma" or k.split_k > 1):
        raise ValueError("a cluster multicasts B's tile by TMA, without split-K")
    for side in "AB":
        if moves[side] not in ("tma", "cp.async", "ldg"):
            raise ValueError(f"the wgmma emitter has no {moves[side]} producer")
    maps = {}
    for ld in lw.pipeline.loads:
        maps[ld.side] = sig.tensormap(TmaSpec.of(operand_map(lw, ld)))
    return _Kernel(name, model, lw, lw.pipeline, sig, sig.sizes(), index_type(lw.index_width), off, stride, moves,
                   consumers, slabs, maps)


def emit_wgmma(name: str, model: Model, lw: ContractionLowering, static: dict[str, int],
               early_main_loop: bool = False) -> CudaKernel:
    """`early_main_loop`: no earlier kernel of the plan writes what the main loop reads (the operands
    and their index tensors), so the kernel runs its main loop while the previous kernel may still be
    running, and its consumers wait for it (griddepcontrol.wait) only before each epilogue; otherwise
    every thread waits first."""
    kc = _prepare(name, model, lw, static)
    k, ring = lw.kernel, kc.ring
    vecs = {"A": k.a_vector, "B": k.b_vector}
    split = warp_specialized_split(k.warps, k.blocks_per_sm)
    threads = 128 * (kc.consumers + 1)
    cluster = k.split_k if lw.cluster_split else ring.cluster  # a cluster split's blocks, or B's multicast
    attrs = f"__cluster_dims__({cluster}, 1, 1) " if cluster > 1 else ""
    sync_end = ("  habu::cluster_sync();  // no block leaves while a peer may still write its shared memory\n"
                if ring.cluster > 1 else "")
    # B ahead: each role waits for the plan's previous kernel itself (the producer after B's first boxes)
    role_wait = bool(ring.ahead) and not early_main_loop
    roles = f"{_producer(kc, vecs, split.producer, role_wait)}{_consumers(kc, split, early_main_loop, role_wait)}"
    body = f"""{wgmma_function(lw.bn, lw.a.dtype, lw.b.positions[-1].axis == "n", lw.a.positions[-1].axis == "m")}
extern "C" __global__ void {attrs}__launch_bounds__({threads}, {k.blocks_per_sm}) {name}(SIGNATURE) {{
{_setup(kc, early_main_loop, references(roles, "smem"))}{roles}{sync_end}}}
"""
    src = header(f"{name}: warp-specialised wgmma contraction {lw.bm}x{lw.bn}x{lw.bk}, {ring.stages} stages, "
                 f"{kc.consumers} consumer warpgroup(s)",
                 [f"computes {', '.join(k.nodes)}; A by {k.a_move}, B by {k.b_move}; split_k={k.split_k}; "
                  f"index width {lw.index_width}"
                  + (f"; clusters of {ring.cluster} blocks along m share B's tile by TMA multicast"
                     if ring.cluster > 1 else "")
                  + (f"; the {k.split_k} splits of a tile are a cluster adding their partials in shared memory"
                     if lw.cluster_split else "")
                  + (f"; {k.blocks_per_sm} blocks an SM (one's epilogue beside another's main loop)"
                     if k.blocks_per_sm > 1 else "")])
    src += body.replace("SIGNATURE", kc.sig.declaration())
    zero = (lw.out.tensor,) if lw.zeroed_output else ()  # a scatter-add keeps its prior contents
    layout = lowering_smem(lw)
    spaces = column_sum_workspaces(lw)  # a column sum over several tile rows: its sums and counters
    return CudaKernel(name, src, tuple(kc.sig.params), threads, layout.total, lw, zero + spaces.get("zero", ()),
                      register_demand=split.demand, cluster=cluster, workspace=spaces.get("workspace", ()),
                      zero_once=spaces.get("zero_once", ()))
