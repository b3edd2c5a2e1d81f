"""What each kernel path can build, as pure predicates and estimates over a lowering: the part of a
kernel path (habu/paths/) that the rules (habu/prove) and the emitters (habu/emit_cuda) read, kept
here, below both, so that neither restates it.

A `PathSupport` names its path, says which plan kernels it takes (`accepts`), which rule family
checks them (`family`: "contraction", "rows" or "map", the families of habu/prove/rules.py), why a
lowering is outside what its emitter prints (`refusals`: the `supported-path` rule), and, for a
contraction, its instruction shape (`mma-shape`) and register estimate (`register-budget`).
`SUPPORT` is the list the rules consult (`support_for`); each path object of habu/paths/ exposes
its entry as `.support`. See docs/ARCHITECTURE.md, "Adding a kernel path".
"""

from __future__ import annotations

from dataclasses import dataclass

from habu.lower.access import Access
from habu.lower.column_epilogue import column_sum_refusal
from habu.lower.contraction import ContractionLowering, fma_thread_grid, is_batch_axis
from habu.lower.general import Store
from habu.lower.grouped_wgmma import wgmma_refusal
from habu.lower.grouped_wgrad import GroupedWgradLowering, wgrad_refusal
from habu.lower.layouts import WGMMA_K_SPANS
from habu.lower.pipeline import MbarrierRing, lag_refusal
from habu.lower.registers import RegisterSplit, consumer_warpgroups, warp_specialized_split
from habu.lower.smem import SmemLayout, simt_smem, tensor_core_smem
from habu.lower.staging import main_loop_move
from habu.plan.plan import (
    SPLIT_CLUSTERS,
    AttentionKernel,
    ColumnKernel,
    ContractionKernel,
    GeneralKernel,
    GroupedKernel,
    Kernel,
    MapKernel,
    RowKernel,
)
from habu.plan.row_fusion import reads_own_rows
from habu.spec.dtypes import DTYPES
from habu.target import Target

TENSOR_CORE_DTYPES = ("bf16", "f16")


@dataclass(frozen=True)
class ShapeCheck:
    """The `mma-shape` obligation of a contraction path: whether it holds and how to say so."""

    ok: bool
    statement: str
    detail: str


def kernel_consumer_warpgroups(kernel: ContractionKernel) -> int:
    """A wgmma kernel's consumer warpgroups (`consumer_warpgroups`, habu/lower/registers.py)."""
    return consumer_warpgroups(kernel.warps, kernel.warp_specialized)


def contiguous_along(acc: Access, axis: str) -> bool:
    last = acc.positions[-1]
    return last.kind == "axis" and last.axis == axis


class PathSupport:
    """One kernel path's limits. Subclasses set `name` and `family` and override what differs."""

    name: str = ""
    family: str = ""

    def accepts(self, kernel: Kernel) -> bool:
        raise NotImplementedError

    def refusals(self, lw) -> list[str]:
        """Why the path's emitter cannot print this lowering (empty: it can)."""
        return []


def _b_ahead_refusals(lw: ContractionLowering, mma: str) -> list[str]:
    """An operand's boxes ahead of the rest of the fill (`b_ahead`, `a_ahead`): a wgmma ring's, that operand by
    TMA into the block alone, one operand ahead."""
    k = lw.kernel
    sides = [s for s in "ab" if getattr(k, f"{s}_ahead", False)]
    if len(sides) > 1:
        return ["a_ahead and b_ahead: one operand's boxes go ahead"]
    for s in sides:
        move = k.a_move if s == "a" else k.b_move
        if mma != "wgmma" or str(move) not in ("tma", "staged") or k.cluster_m > 1:
            return [f"{s}_ahead: the wgmma ring issues {s.upper()}'s TMA boxes ahead ({s.upper()} by TMA, no multicast "
                    "cluster)"]
    return []


class ContractionSupport(PathSupport):
    """A contraction path, told apart from the others by the kernel's `mma` field."""

    family = "contraction"
    mma: str = ""
    emits_clusters = False
    emits_tma_stores = False

    def accepts(self, kernel: Kernel) -> bool:
        return isinstance(kernel, ContractionKernel) and kernel.mma == self.mma

    def refusals(self, lw: ContractionLowering) -> list[str]:
        return [*self.own_refusals(lw), *_cluster_refusals(lw, self.emits_clusters),
                *_split_cluster_refusals(lw, self.emits_clusters),
                *_tma_store_refusals(lw, self.emits_tma_stores), *self.movement_refusals(lw), *_batch_refusals(lw),
                *_k_gather_refusals(lw), *_b_ahead_refusals(lw, self.mma), *_column_sum_refusals(lw),
                *_lag_refusals(lw)]

    def own_refusals(self, lw: ContractionLowering) -> list[str]:
        """The refusals about the instruction's own layout (what its emitter checks before printing;
        the rest concern clusters, TMA stores and movements, which the rules alone check)."""
        return []

    def movement_refusals(self, lw: ContractionLowering) -> list[str]:
        return []

    def shape(self, lw: ContractionLowering, target: Target) -> ShapeCheck:
        raise NotImplementedError

    # the shared-memory layout the rules check and the emitter prints (habu/lower/smem.py)
    smem_layout = staticmethod(tensor_core_smem)

    def registers(self, kernel: ContractionKernel) -> int:
        """About how many registers a thread needs (accumulators, addresses, indices)."""
        raise NotImplementedError

    def register_split(self, kernel: ContractionKernel) -> RegisterSplit | None:
        """How a warp-specialised kernel splits the register file (`setmaxnreg`), or None."""
        return None


def accumulator_registers(kernel: ContractionKernel) -> int:
    """Accumulator registers per thread of the warps that hold the output tile."""
    consumers = kernel.warps - (4 if kernel.warp_specialized else 0)
    return (kernel.tile_m * kernel.tile_n) // (32 * max(1, consumers))


def _tensor_cores(lw: ContractionLowering) -> bool:
    return lw.a.dtype == lw.b.dtype and lw.a.dtype in TENSOR_CORE_DTYPES


def _cluster_refusals(lw: ContractionLowering, emitted: bool) -> list[str]:
    k = lw.kernel
    if k.cluster_m <= 1:
        return []
    c, reasons = k.cluster_m, []
    # each block loads 1/c of B's tile and multicasts it: K-major, a box of tile_n/c rows (whole
    # 8-row swizzle atoms); N-major, whole 64-column boxes
    b_parts_ok = (k.tile_n % (8 * c) == 0 if contiguous_along(lw.b, "k")
                  else (k.tile_n // 64) % c == 0 and k.tile_n % 64 == 0)
    if not emitted or not k.warp_specialized:
        reasons.append("clusters are emitted in the warp-specialised wgmma path")
    if k.b_move not in ("tma", "staged"):
        reasons.append("a cluster shares B's tile by TMA multicast: B moves by tma (or staged, then tma)")
    if k.split_k > 1:
        reasons.append("clusters and split-K are not emitted together")
    if not b_parts_ok:
        reasons.append(f"B's tile of {k.tile_n} splits into {c} whole parts (8-row atoms, or 64-column boxes)")
    if c not in (1, 2):
        reasons.append("clusters of 2 blocks")
    return reasons


def _split_cluster_refusals(lw: ContractionLowering, emitted: bool) -> list[str]:
    """A cluster split (habu/lower/split_cluster.py): the warp-specialised wgmma path prints it, one tile
    per block (its blocks leave together), direct stores, no cluster along m, a portable cluster size
    that divides the tile's rows, and the partial tile within the ring's shared memory."""
    k = lw.kernel
    if k.split_reduce != "cluster" or k.split_k == 1:  # (unsplit: nothing to reduce, the field is moot)
        return []
    reasons = []
    if not emitted or not k.warp_specialized or lw.reduction is None:
        reasons.append("a cluster split is emitted in the warp-specialised wgmma path")
    if k.split_k not in SPLIT_CLUSTERS:
        reasons.append(f"a cluster split has {', '.join(map(str, SPLIT_CLUSTERS))} blocks (split_k {k.split_k})")
    elif k.tile_m % k.split_k:
        reasons.append(f"a cluster split's {k.split_k} blocks each finish {k.tile_m}/{k.split_k} whole rows")
    if k.persistent:
        reasons.append("a cluster split runs one tile per block (not persistent)")
    if k.store != "direct":
        reasons.append("a cluster split stores its sums directly (store direct)")
    if k.cluster_m > 1:
        reasons.append("a cluster split and a cluster along m are not emitted together")
    if lw.batch:
        reasons.append("a batched contraction runs without a cluster split")
    if lw.store is not Store.WRITE:
        reasons.append("a scatter-add adds atomically: no cluster split")
    if lw.reduction is not None:
        ring = stage_bytes(lowering_smem(lw))
        if lw.reduction.base + lw.reduction.bytes > ring:
            reasons.append(f"the {lw.reduction.bytes}-byte partial tile fits over the ring's {ring} bytes of stages")
    return reasons


def _k_gather_refusals(lw: ContractionLowering) -> list[str]:
    """An operand gathered on the reduction axis (`A[IX[m] k]`, m summed) is read through a staging pass
    that gathers its rows into a plain buffer: no loader of the main loop gathers along k."""
    k = lw.kernel
    return [f"{src.tensor} is gathered on the reduction axis: it moves by staged (a pass gathers its rows)"
            for src, move in ((lw.a_src, k.a_move), (lw.b_src, k.b_move))
            if src is not None and move != "staged" and any(p.kind == "gather" and p.axis == "k" for p in src.positions)]


def _batch_refusals(lw: ContractionLowering) -> list[str]:
    """A batched contraction (batch indices as a grid dimension) is emitted without clusters (the multicast
    loads are 2-D). (Its staging passes keep the batch axes as the buffer's outer dimensions.)"""
    k = lw.kernel
    if not lw.batch:
        return []
    reasons = []
    if k.cluster_m > 1:
        reasons.append("a batched contraction runs without clusters")
    return reasons


def _lag_refusals(lw: ContractionLowering) -> list[str]:
    """A consumer lag (`consumer_lag`, `lag_refusal`; a persistent block's tiles long enough that the named barrier's
    phases never mix: the `pipeline-schedule` rule, at every size of k)."""
    lag = getattr(lw.kernel, "consumer_lag", 0)
    refusal = lag_refusal(lw.kernel, lag) if lag else None
    ring = lw.pipeline
    if refusal is None and lag and isinstance(ring, MbarrierRing):
        # the epilogue's named barriers are 1 + cw (each warpgroup's) and 1 + consumers (a column sum's), a
        # cluster split's 15: the lag's must be none of them, or two barriers' arrivals would mix (a hang)
        taken = {*range(1, ring.consumers + 2), 15}
        ids = {int(ring.lag_barrier(c)) for c in range(1, ring.consumers)}
        if ids & taken or not all(0 < i < 16 for i in ids):
            refusal = f"consumer_lag: its named barriers {sorted(ids)} meet the epilogue's {sorted(taken)} or leave 1..15"
    return [refusal] if refusal else []


def _column_sum_refusals(lw: ContractionLowering) -> list[str]:
    """A column sum in the epilogue (habu/lower/column_epilogue.py): the wgmma path's TMA-store epilogue prints it."""
    cs = lw.column_sum
    refusal = None if cs is None else column_sum_refusal(cs, lw.kernel)
    return [refusal] if refusal else []


def _tma_store_refusals(lw: ContractionLowering, emitted: bool) -> list[str]:
    k, out = lw.kernel, lw.out
    if k.store != "tma":
        return []
    reasons = []
    # [m, n] after any batch positions (a batched output's box is 1 along each)
    rest = [p for p in out.positions if not (p.kind == "axis" and is_batch_axis(p.axis))]
    plain = (len(rest) == 2 and all(p.kind == "axis" for p in out.positions)
             and rest[0].axis == "m" and rest[1].axis == "n" and out.positions[-1].axis == "n")
    if not emitted:
        reasons.append("TMA stores are emitted in the wgmma path")
    if k.split_k > 1:
        reasons.append("split-K adds its partial sums atomically, not by TMA stores")
    if not plain or out.dtype not in ("f32", "bf16", "f16"):
        reasons.append("TMA stores write an f32/bf16/f16 output stored row-major over (m, n) (after any batch)")
    return reasons


class FmaSupport(ContractionSupport):
    name = mma = "fma"
    smem_layout = staticmethod(simt_smem)

    def movement_refusals(self, lw: ContractionLowering) -> list[str]:
        k = lw.kernel
        # (a staged operand's buffer is read by ldg at vector 1: `main_loop_move`)
        moves = [main_loop_move("fma", str(m), v, DTYPES[acc.dtype].bytes)
                 for m, v, acc in ((k.a_move, k.a_vector, lw.a), (k.b_move, k.b_vector, lw.b))]
        return ["the SIMT path loads with ldg (a staged operand's buffer at vector 1)"] if any(
            m != "ldg" for m in moves) else []

    def shape(self, lw: ContractionLowering, target: Target) -> ShapeCheck:
        k = lw.kernel
        grid = fma_thread_grid(k)
        return ShapeCheck(grid is not None and grid[2] * grid[3] <= 64,
                          "SIMT FMA: the tile divides evenly over the threads, at most 64 outputs each",
                          f"tile {k.tile_m}x{k.tile_n} over {32 * k.warps} threads")

    def registers(self, kernel: ContractionKernel) -> int:
        return accumulator_registers(kernel) + 48


def mma_sync_warp_grid(kernel: ContractionKernel) -> tuple[int, int]:
    """The mma.sync path's warps over the tile: (along m, along n)."""
    wm = 2 if kernel.warps >= 4 else 1
    return wm, kernel.warps // wm


class MmaSyncSupport(ContractionSupport):
    name = mma = "mma.sync"

    def own_refusals(self, lw: ContractionLowering) -> list[str]:
        reasons = []
        # A stored [k m] is staged [BK][BM+8] and read by ldmatrix.x4.trans (habu/lower/layouts.py); an A whose
        # innermost index is neither (a batch axis: `A[m k s]`) is staged so too, copied an element at a time
        if not contiguous_along(lw.a, "k") and not contiguous_along(lw.a, "m") and lw.kernel.a_move != "ldg":
            reasons.append("the mma.sync path reads A contiguous along k, or along m (ldmatrix.trans), or an "
                           "element at a time (ldg)")
        if not contiguous_along(lw.a, "k") and lw.kernel.a_move == "tma-gather4":
            reasons.append("gather4 brings whole k rows of A: an A contiguous along m is copied by cp.async or ldg")
        if lw.kernel.swizzle:
            reasons.append("the mma.sync path pads shared rows by 16 bytes (swizzle 0)")
        return reasons

    def movement_refusals(self, lw: ContractionLowering) -> list[str]:
        k = lw.kernel
        reasons = []
        if "tma" in (k.a_move, k.b_move) or k.b_move == "tma-gather4":
            reasons.append("the mma.sync path stages with cp.async or ldg (and gather4 for A on sm_100a)")
        # (a staged operand's buffer is read by cp.async or ldg: `main_loop_move`)
        return reasons

    def shape(self, lw: ContractionLowering, target: Target) -> ShapeCheck:
        k = lw.kernel
        wm, wn = mma_sync_warp_grid(k)
        ok = (target.mma_sync and _tensor_cores(lw) and k.tile_m % (16 * wm) == 0
              and k.tile_n % (8 * wn) == 0 and k.tile_k % 16 == 0 and k.warps in (1, 2, 4, 8))
        return ShapeCheck(ok, f"mma.sync m16n8k16 over a {wm}x{wn} warp grid (bf16/f16 operands)",
                          f"{lw.a.dtype}/{lw.b.dtype} operands, tile {k.tile_m}x{k.tile_n}x{k.tile_k}, "
                          f"{k.warps} warps")

    def registers(self, kernel: ContractionKernel) -> int:
        wn = max(1, kernel.warps // 2)
        mi, ni = kernel.tile_m // 2 // 16, kernel.tile_n // wn // 8
        return accumulator_registers(kernel) + 4 * mi + 2 * ni + 32


class WgmmaSupport(ContractionSupport):
    name = mma = "wgmma"
    emits_clusters = emits_tma_stores = True

    def own_refusals(self, lw: ContractionLowering) -> list[str]:
        k = lw.kernel
        e = DTYPES[lw.a.dtype].bytes
        reasons = []
        if not k.warp_specialized:
            reasons.append("the wgmma path is warp-specialised")
        if k.tile_k * e not in tuple(128 * n for n in WGMMA_K_SPANS) or k.swizzle != 128:
            reasons.append("wgmma k tiles are 128, 256 or 512 bytes with the 128-byte swizzle")
        elif k.tile_k * e > 128 and k.cluster_m > 1:
            reasons.append("a cluster multicasts B's k tile of one 128-byte span (k tiles of 128 bytes)")
        # an A stored [k m] is read like an N-major B: TMA boxes of 64 columns, the transpose bit
        m_major_ok = k.a_move == "tma" and e == 2 and k.tile_m % 64 == 0 and contiguous_along(lw.a, "m")
        if not contiguous_along(lw.a, "k") and not m_major_ok:
            reasons.append("wgmma's A is contiguous along k, or along m when loaded by TMA in 64-column "
                           "boxes (16-bit types)")
        # wgmma transposes a 16-bit B read from shared memory N-major, in 64-column (128-byte) boxes
        n_major_ok = k.b_move == "tma" and e == 2 and k.tile_n % 64 == 0 and contiguous_along(lw.b, "n")
        if not contiguous_along(lw.b, "k") and not n_major_ok:
            reasons.append("wgmma's B is contiguous along k, or along n when loaded by TMA in 64-column "
                           "boxes (16-bit types)")
        if k.warps % 4 or k.warps < 8 or k.tile_m % (64 * kernel_consumer_warpgroups(k)):
            reasons.append("warps = 4 × (1 producer + consumer warpgroups of 64-row slabs)")
        if "tma-gather4" in (k.a_move, k.b_move):
            reasons.append("gather4 (sm_100a) is emitted in the mma.sync path, not the wgmma path")
        return reasons

    def shape(self, lw: ContractionLowering, target: Target) -> ShapeCheck:
        k = lw.kernel
        consumers = k.warps - (4 if k.warp_specialized else 0)
        wgs = kernel_consumer_warpgroups(k)
        ok = (target.wgmma and _tensor_cores(lw) and k.warps % 4 == 0 and consumers >= 4
              and k.tile_m % (64 * wgs) == 0 and k.tile_n % 16 == 0 and 16 <= k.tile_n <= 256
              and k.tile_k % 16 == 0)
        return ShapeCheck(ok, f"wgmma m64n{k.tile_n}k16 with {wgs} consumer warpgroup(s) over a {k.tile_m}-row "
                              "tile (N a multiple of 16, not ≡ 8 mod 16; bf16/f16 operands; sm_90a)",
                          f"{lw.a.dtype}/{lw.b.dtype} operands, tile {k.tile_m}x{k.tile_n}x{k.tile_k}, "
                          f"{k.warps} warps on {target.name}")

    def registers(self, kernel: ContractionKernel) -> int:
        return accumulator_registers(kernel) + 36  # descriptors, addresses, the epilogue's indices

    def register_split(self, kernel: ContractionKernel) -> RegisterSplit | None:
        return warp_specialized_split(kernel.warps, kernel.blocks_per_sm) if kernel.warp_specialized else None


class RowsSupport(PathSupport):
    """What the row emitter prints: a block per row (or a warp per row, several rows a block), a
    cluster of blocks sharing a static row of whole vectors, persistent blocks prefetching a row kept
    in registers. The emitter checks these same lists before printing (`emit_rows`), and the rules
    state them (`supported-path`), so a proven plan is never refused by the emitter."""

    name = family = "rows"

    def accepts(self, kernel: Kernel) -> bool:
        return isinstance(kernel, RowKernel)

    def refusals(self, lw) -> list[str]:
        """What holds at every size (the `supported-path` obligation of every row kernel)."""
        k = lw.kernel
        reasons = []
        if k.rows_per_block != 1 and k.threads != 32:
            reasons.append("several rows per block need a warp (32 threads) per row")
        if k.cluster > 1 and (k.threads == 32 or k.rows_per_block != 1):
            reasons.append(f"a cluster of {k.cluster} shares one row among blocks of more than one warp, one row "
                           "per block")
        if k.prefetch and k.rows_per_block != 1:
            reasons.append("prefetching the next row needs one row per block")
        for i, eq in enumerate(lw.nodes):  # a row at a time: what this kernel computes is read in its own row
            reasons += [f"{eq.target} reads {before.target} (computed by this kernel a row at a time) in other rows"
                        for before in lw.nodes[:i] if not reads_own_rows(eq, before.target)]
        if k.prefetch and len(set(lw.loaded_before)) > 1:
            # the next row's copy overwrites the buffer once the first pass has read it: every kept row must
            # be in registers by then
            reasons.append(f"prefetching copies every kept row of the next row at once; this kernel loads "
                           f"{', '.join(a.tensor for a in lw.kept_rows())} before different passes")
        return reasons

    def sized_refusals(self, lw, sizes) -> list[str]:
        """What depends on the row's width (`sizes`: ints where static; z3 terms or C names where the
        extent is known only at run time): a cluster shares a static row of whole vectors of its
        blocks; a prefetching block keeps its row in registers (`RowLowering.register_fit`)."""
        k = lw.kernel
        reasons = self.cluster_refusals(lw, sizes)
        if k.prefetch and not lw.register_chunks(sizes):  # the rule: `_row_prefetch` (habu/prove/rules.py)
            reasons.append(f"prefetching the next row needs this one in registers: {lw.register_fit(sizes)[1]}")
        return reasons

    def cluster_refusals(self, lw, sizes) -> list[str]:
        """A cluster of blocks shares a row whose width is known when the kernel is compiled (each
        block's part, `#C / cluster`, is a constant of the kernel); its vectors are `vector-align`'s."""
        cols = sizes[lw.c]
        if lw.kernel.cluster > 1 and not isinstance(cols, int):
            return [f"a cluster of {lw.kernel.cluster} shares a row of static width (#{lw.c} is known only at run time)"]
        if lw.kernel.cluster > 1 and cols % (lw.kernel.cluster * lw.kernel.vector):
            return [f"#{lw.c} = {cols} is not whole {lw.kernel.vector}-element vectors for each of "
                    f"{lw.kernel.cluster} blocks"]
        return []


class MapSupport(PathSupport):
    name = family = "map"

    def accepts(self, kernel: Kernel) -> bool:
        return isinstance(kernel, MapKernel)


class GeneralSupport(PathSupport):
    """The general family: any equation node, one thread per output element (the fallback)."""

    name = family = "general"

    def accepts(self, kernel: Kernel) -> bool:
        return isinstance(kernel, GeneralKernel)


class ColumnsSupport(PathSupport):
    """The column family: a reduction over the leading axis, blocks over column tiles × row splits."""

    name = family = "columns"

    def accepts(self, kernel: Kernel) -> bool:
        return isinstance(kernel, ColumnKernel)

    def refusals(self, lw) -> list[str]:
        k = lw.kernel
        reasons = []
        if k.threads % k.column_threads:
            reasons.append(f"the block's {k.threads} threads are whole row groups of {k.column_threads} column threads")
        return reasons


class GroupedSupport(PathSupport):
    """The grouped-GEMM family: one launch over every group's tiles, mma.sync m16n8k16 on bf16 (an f32 A
    staged as two bf16 parts)."""

    name = family = "grouped"

    def accepts(self, kernel: Kernel) -> bool:
        return isinstance(kernel, GroupedKernel)

    def refusals(self, lw) -> list[str]:
        k = lw.kernel
        reasons = []
        if isinstance(lw, GroupedWgradLowering):  # the weight-gradient form (habu/lower/grouped_wgrad.py)
            refusal = wgrad_refusal(k, lw.a.dtype, lw.b.dtype, lw.row_scale is not None)
            return [refusal] if refusal else []
        if lw.uses_wgmma:  # the wgmma main loop's own limits (habu/lower/grouped_wgmma.py)
            refusal = wgmma_refusal(k, lw.a.dtype, lw.w.dtype, lw.pair is not None, lw.w_n_major)
            return [refusal] if refusal else []
        if lw.w_n_major:
            reasons.append(f"the mma.sync loop stages 16-byte chunks of W's rows along #{lw.k}: {lw.w.tensor} is stored "
                           f"with #{lw.n} last (n-major), which only the wgmma loop reads (--pin main_loop=wgmma)")
        if lw.warp_rows % 16 or lw.warp_cols % 8:
            reasons.append(f"a warp's tile ({lw.warp_rows} × {lw.warp_cols}) is whole 16 × 8 mma tiles")
        if (k.bm * k.bk // 8) % lw.threads or (k.bn * k.bk // 8) % lw.threads:
            reasons.append(f"the {lw.threads} threads stage whole 16-byte chunks of the {k.bm}×{k.bk} and "
                           f"{k.bn}×{k.bk} tiles")
        if lw.a.dtype not in ("bf16", "f32") or lw.w.dtype != "bf16":
            reasons.append("the operands are bf16 (mma.sync m16n8k16 bf16; an f32 A is split into bf16 parts)")
        return reasons


class AttentionSupport(PathSupport):
    """The fused attention family (FlashAttention-2 style, habu/lower/attention.py): mma.sync m16n8k16 on bf16."""

    name = family = "attention"

    def accepts(self, kernel: Kernel) -> bool:
        return isinstance(kernel, AttentionKernel)

    def refusals(self, lw) -> list[str]:
        reasons = []
        if lw.kernel.bm % (16 * lw.kernel.warp_m) or lw.kernel.bn % 16:
            reasons.append(f"the query tile ({lw.kernel.bm}) is whole warps of {16 * lw.kernel.warp_m} rows and the KV "
                           f"tile ({lw.kernel.bn}) whole 16-key steps")
        if any(a.dtype != "bf16" for a in (lw.q, lw.k, lw.v)):
            reasons.append("Q, K and V are bf16 (mma.sync m16n8k16 bf16)")
        if lw.out.dtype not in ("f32", "bf16", "f16"):
            reasons.append("O is stored as f32, bf16 or f16")
        return reasons


FMA, MMA_SYNC, WGMMA, ROWS, MAP = FmaSupport(), MmaSyncSupport(), WgmmaSupport(), RowsSupport(), MapSupport()
GENERAL, COLUMNS, GROUPED = GeneralSupport(), ColumnsSupport(), GroupedSupport()
ATTENTION = AttentionSupport()

# the built-in paths' limits, in the order of habu/paths/__init__.py's PATHS; `register` adds one
SUPPORT: list[PathSupport] = [FMA, MMA_SYNC, WGMMA, ROWS, MAP, COLUMNS, GROUPED, ATTENTION, GENERAL]


def register(support: PathSupport) -> None:
    """Add (first, so it wins over a built-in that takes the same kernels) or replace a path's limits."""
    SUPPORT[:] = [support, *(s for s in SUPPORT if s.name != support.name)]


def unregister(name: str) -> None:
    SUPPORT[:] = [s for s in SUPPORT if s.name != name]


def contraction_smem(kernel: ContractionKernel, a_dtype: str, b_dtype: str, b_kmajor: bool = True,
                     a_kmajor: bool = True) -> SmemLayout:
    """The shared-memory layout of a contraction kernel, as its path lays it out (the rules check it,
    the emitter prints its offsets). `b_kmajor`: B is contiguous along k (tiles [BN][BK], else [BK][BN]);
    `a_kmajor`: likewise A ([BM][BK], else [BK][BM])."""
    support = support_for(kernel)
    assert isinstance(support, ContractionSupport)
    return support.smem_layout(kernel, a_dtype, b_dtype, b_kmajor, a_kmajor)


def stage_bytes(layout: SmemLayout) -> int:
    """Where the ring's stage tiles end (they start at byte 0): a cluster split's partial tile goes over them."""
    return max(b.offset + b.size for b in layout.buffers if b.name[0] in "AB")


def lowering_smem(lw: ContractionLowering) -> SmemLayout:
    """The shared-memory layout of a lowered contraction, from its operands' dtypes and layouts
    (`b_kmajor`, `a_kmajor`): the one the rules check, the operand maps are built on and the emitters print."""
    return contraction_smem(lw.kernel, lw.a.dtype, lw.b.dtype, lw.b_kmajor, lw.a_kmajor)


def support_for(kernel: Kernel) -> PathSupport:
    """The limits of the first path that takes `kernel`."""
    for s in SUPPORT:
        if s.accepts(kernel):
            return s
    raise ValueError(f"no kernel path takes a {type(kernel).__name__} with mma={getattr(kernel, 'mma', None)}")
