"""An analytic cost model: a roofline of each kernel's FLOPs and bytes against the target's measured
ceilings, with the few efficiency terms the H200 measurements showed to matter. It orders what the
search compiles and times; it never decides alone what is kept when a GPU is there.

The ceilings are the target's (`Target.ceilings`, in its file under habu/targets/, with where each
figure was measured). The roofline is the hardware's bound, not the cost model's: `wgmma_peak`, what
wgmma alone sustains, above `wgmma_flops`, what real kernels reach.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from habu.lower import (
    ColumnLowering,
    ContractionLowering,
    GeneralLowering,
    Lowering,
    MapLowering,
    RowLowering,
    lower_plan,
)
from habu.lower.access import Access, size_of
from habu.lower.contraction import ACC
from habu.lower.general import Store
from habu.lower.rows import reduction_passes
from habu.lower.window_share import window_share
from habu.paths import ContractionPath, path_for
from habu.paths.columns import ColumnsPath
from habu.plan.plan import Plan
from habu.search.arithmetic import element_instructions
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Expr, Model, Op, Reduce
from habu.target import Target
from habu.targets import Ceilings


@dataclass
class KernelCost:
    flops: float
    bytes: float
    seconds: float
    bound: str  # "compute" or "memory"

    @property
    def roofline_seconds(self) -> float:
        return self.seconds


def _bytes(acc: Access, sizes: Mapping[str, int]) -> float:
    n = 1
    for e in acc.extents:
        n *= size_of(e, sizes)
    return float(n * DTYPES[acc.dtype].bytes)


def contraction_cost(lw: ContractionLowering, sizes: Mapping[str, int], target: Target, c: Ceilings) -> KernelCost:
    k = lw.kernel
    M, N, K = sizes[lw.m], sizes[lw.n], sizes[lw.k]
    nb = int(lw.batches(sizes))  # a batched contraction: nb products of M x N x K
    share = window_share(lw, sizes)  # the k steps a window leaves (the k tiles the model makes zero, skipped)
    flops = 2.0 * M * N * K * nb
    out_bytes = M * N * DTYPES[lw.out.dtype].bytes * nb
    moved = (_bytes(lw.a, sizes) + _bytes(lw.b, sizes)) * share + out_bytes
    moved += sum(_bytes(a, sizes) for _, a in lw.epi_loads)
    # the chain's other outputs (`extra_outs`), stored beside the output
    extra_bytes = sum(_bytes(a, sizes) for _, a in lw.extra_outs)
    moved += extra_bytes
    # staging copies: a row copy (gathered) moves 2-byte elements one per thread, measured ~1.4 TB/s
    # (a third of the copy bandwidth) for A = 4096 x 4096 bf16 on the H200; the tiled transpose
    # (W staged K-major) 2.8 TB/s for 4096 x 4096 bf16 (2026-11-30)
    copied = [2 * _bytes(st.dst, sizes) for st in lw.pre]
    staging_s = sum(b * (1.5 if st.tile else 3.0) for b, st in zip(copied, lw.pre, strict=True)) / c.bandwidth
    # split-K (atomic): the output is zeroed first, and each split's tile ends in f32 atomic adds
    # (a read and a write per element) while its tensor cores idle: not hidden behind the main loop
    reduction = 0.0
    cluster_split = k.split_k > 1 and k.split_reduce == "cluster"
    if cluster_split:  # the partials meet in the cluster's shared memory: no zeroing, no atomics, one launch
        reduction = k.split_k * M * N * 4 * nb / 8  # (distributed shared memory, about 8x the DRAM's rate)
    elif k.split_k > 1:
        reduction = (M * N * 4 + k.split_k * M * N * 8) * nb
    path = path_for(k)
    assert isinstance(path, ContractionPath)
    peak = path.peak_flops(c) or c.fma_flops
    # operand feeds: a scalar-load producer cannot keep tensor cores busy (what cp.async costs is its
    # refill traffic, below: a flat 15% on it ranked the MoE winner 264th of 1135 timed plans)
    feed = 1.0
    for move in (k.a_move, k.b_move):
        feed *= {"ldg": path.ldg_feed, "cp.async": 1.0, "tma": 1.0, "staged": 1.0,
                 "tma-gather4": 1.05}[move]
    # smaller tiles reuse less and issue more: measured 128x256 > 128x128 by ~15% on the H200
    tile_eff = min(1.0, (k.tile_m * k.tile_n / (128 * 256)) ** 0.25)
    ea, eb = DTYPES[lw.a.dtype].bytes, DTYPES[lw.b.dtype].bytes
    stage_eff = path.stage_efficiency(k, ea, eb)
    # the last wave of tiles runs with idle SMs
    tiles = -(-M // k.tile_m) * -(-N // k.tile_n) * k.split_k * nb
    waves = tiles / target.sm_count
    wave_eff = waves / max(1.0, -(-tiles // target.sm_count)) if waves >= 1 else waves
    compute = flops / (peak * tile_eff * stage_eff * max(wave_eff, 1e-3)) * feed * share
    memory = moved / c.bandwidth
    # operand tiles copied by cp.async (a gathered A) refill shared memory from L2 at about 5.5 TB/s
    # in all, once per tile of the other operand (same runs: 256x64 tiles copy 2.1 GB of A, 409 µs;
    # 256x96 1.4 GB, 328; 256x128 1.1 GB, 236; 128x256 0.5 GB, 184, bound by the multiplies)
    refill = 0.0
    if k.a_move == "cp.async":  # the rows the contraction reads (a gather reads M of them), per tile column
        refill += M * K * ea * -(-N // k.tile_n) * nb
    if k.b_move == "cp.async":
        refill += N * K * eb * -(-M // k.tile_m) * nb
    compute = max(compute, refill / c.cp_async_bandwidth)
    # the epilogue's stores, after each tile's main loop: from registers they are not hidden (pairs
    # of 16-bit values go out 4 bytes a thread, at half the rate); TMA stores drain while the next
    # tile runs. H200, 4096³: bf16 GEMM 189.5 µs direct, 171.1 µs TMA; f32 GGEMM 184.5 and 181.1 µs,
    # 175.1 µs with no epilogue at all (2026-11-30)
    out_e = DTYPES[lw.out.dtype].bytes
    epilogue_s = out_bytes / c.bandwidth * (0.5 if k.store == "tma" else max(1.0, 8 / (2 * out_e)))
    if lw.store is Store.ATOMIC_ADD:
        epilogue_s = scatter_epilogue_seconds(out_bytes, c)
    staged = {a.tensor for _, a in lw.staged_extras}  # staged beside the output and stored by TMA as it is
    for _, extra in lw.extra_outs:  # the others: direct stores, whatever the output's store
        epilogue_s += _bytes(extra, sizes) / c.bandwidth * (
            0.5 if extra.tensor in staged else max(1.0, 8 / (2 * DTYPES[extra.dtype].bytes)))
    epilogue_s += epilogue_arithmetic_seconds(lw, M * N * nb, c)
    seconds = max(compute, memory) + epilogue_s + staging_s + reduction / c.bandwidth \
        + c.launch_s * (1 + len(lw.pre) + (k.split_k > 1 and not cluster_split))
    return KernelCost(flops * share, moved + sum(copied) + reduction, seconds,
                      "compute" if compute >= memory else "memory")


# The consumer warps of a tile (two or three a scheduler) issue a fused epilogue's arithmetic at about half
# of what a full SM issues, after the tile's main loop, its tensor cores idle. H200, 4096 x 14336 x 4096 bf16
# (2026-12-02, docs/PERF.md): the GELU derivative fused into the product (36 instructions an element,
# `habu.search.arithmetic`) 786.0 µs against 627.1 µs for the product alone: 159 µs, where 58.7 M elements
# at the full rate (`fma_flops` / 2 instructions a second) take 85 µs.
EPILOGUE_ISSUE = 0.53
IN_REGISTERS = frozenset({ACC})  # what a contraction epilogue reads without a load


def epilogue_arithmetic_seconds(lw: ContractionLowering, elements: float, c: Ceilings) -> float:
    """The fused epilogue's arithmetic (every value it stores; the accumulator is in registers)."""
    per = element_instructions(*(value for value, _ in lw.stores), free=IN_REGISTERS)
    return elements * per / (c.fma_flops / 2 * EPILOGUE_ISSUE)


# A scatter-add epilogue's f32 reductions (`dA[IX[m] k] += Σ n …`), issued by the consumer warps after each
# tile's main loop and overlapped with nothing. H200, GGEMM's backward: at 4096³ (dA 64 MB, past the 50 MB L2:
# each reduction reads its line from DRAM) 361 µs against 172 µs stored plainly by TMA, 67 MB of reductions
# in 189 µs, a twelfth of the copy bandwidth; at 1024³ (dA 4 MB, in the L2) about 9 µs over the product,
# half of it (2026-12-02, docs/PERF.md).
SCATTER_IN_L2_BYTES = 32 << 20


def scatter_epilogue_seconds(out_bytes: float, c: Ceilings) -> float:
    return out_bytes / (c.bandwidth / (12.0 if out_bytes > SCATTER_IN_L2_BYTES else 2.0))


def operand_dram_bytes(lw: Lowering, sizes: Mapping[str, int], target: Target) -> float:
    """A finer term, for ordering plans the roofline predicts equal (ties, not the time): the operand
    bytes a contraction fetches from DRAM if the L2 holds the operand tiles of one wave of blocks. The
    raster order and grouping decide which tiles a wave shares (grouped rasterisation walks `group_m`
    tile rows together, so a wave reads fewer distinct B tiles). 0 for other kernels."""
    if path_for(lw.kernel).family != "contraction":  # terms of the contraction paths only
        return 0.0
    k = lw.kernel
    M, N, K = sizes[lw.m], sizes[lw.n], sizes[lw.k]
    ea, eb = DTYPES[lw.a.dtype].bytes, DTYPES[lw.b.dtype].bytes
    tiles_m, tiles_n = -(-M // k.tile_m), -(-N // k.tile_n)
    tiles = tiles_m * tiles_n * k.split_k * int(lw.batches(sizes))  # (a batched grid walks one batch after another)
    wave = max(1, min(tiles, target.sm_count))
    along, across = (tiles_n, tiles_m) if k.raster == "row" else (tiles_m, tiles_n)
    first = min(along, -(-wave // max(1, k.group_m)))  # tiles of the fast axis a wave covers
    second = min(across, -(-wave // first))
    rows, cols = (second, first) if k.raster == "row" else (first, second)
    per_wave = K / max(1, k.split_k) * (rows * k.tile_m * ea + cols * k.tile_n * eb)
    return float(-(-tiles // wave) * per_wave)


def tie_break(lw: Lowering, sizes: Mapping[str, int], target: Target) -> tuple[float, float, float, float]:
    """The order of plans the roofline predicts equal (ties, not the time), from terms it leaves out,
    compared in this order:

    1. pipeline depth, deeper first (more k tiles in flight hide more load latency);
    2. cold pipeline fills: the operand bytes of one k step a block loads before its first multiply,
       once per tile for a non-persistent kernel, once per SM for a persistent one;
    3. operand bytes moved from the L2 into shared memory (a multicast operand counts once per
       cluster);
    4. operand bytes fetched from DRAM (`operand_dram_bytes`: raster order and grouping).

    The order is the one that best ranked equal predictions of a 148-plan GGEMM 4096³ search timed
    on the H200 (Spearman within tied groups 0.58, against 0.05 for the DRAM bytes alone), and it
    ranked the 80 tied plans of a GEMM 8192³ search (not used to choose it) at 0.49 against 0.43
    (2026-12-01, docs/PERF.md). Other kernels: zeros."""
    if path_for(lw.kernel).family != "contraction":  # terms of the contraction paths only
        return (0.0, 0.0, 0.0, 0.0)
    k = lw.kernel
    M, N, K = sizes[lw.m], sizes[lw.n], sizes[lw.k]
    ea, eb = DTYPES[lw.a.dtype].bytes, DTYPES[lw.b.dtype].bytes
    tiles = -(-M // k.tile_m) * -(-N // k.tile_n) * k.split_k * int(lw.batches(sizes))
    step = float(k.tile_k * (k.tile_m * ea + k.tile_n * eb))
    cold = step * (min(tiles, target.sm_count) if k.persistent else tiles)
    multicast = max(1, k.cluster_m or 1)
    l2 = tiles * K / max(1, k.split_k) * (k.tile_m * ea + k.tile_n * eb / multicast)
    return (-float(k.stages), cold, float(l2), operand_dram_bytes(lw, sizes, target))


def rows_cost(lw: RowLowering, sizes: Mapping[str, int], c: Ceilings) -> KernelCost:
    R, C = lw.rows(sizes), sizes[lw.c]
    # each tensor once, however many times the region's words read it (SOFTMAX reads x three times)
    per_tensor: dict[str, float] = {}
    for _, a in lw.loads:
        per_tensor[a.tensor] = max(per_tensor.get(a.tensor, 0.0), _bytes(a, sizes))
    reads = sum(per_tensor.values())
    writes = sum(_bytes(a, sizes) for a in lw.stores())  # a stored statistic's too (RMSNorm's saved rstd)
    passes = len(reduction_passes(lw.expression()))
    reread = 1.0 if lw.kernel.cache_row else float(1 + passes)
    flops = 10.0 * R * C * (1 + passes)
    # per-row setup and barriers: short rows reach a smaller fraction of the bandwidth (H200,
    # 2026-12-01: 86% of copy at 4096 columns, 91-96% at 16384, RMSNorm 95% at 65536)
    eff = min(0.92, max(0.5, 0.80 + 0.04 * (C.bit_length() - 13)))
    if not passes:  # no reduction pass: every access moves one 2- or 4-byte element a thread (H200,
        # 4096 x 14336 bf16, 2026-12-02: GELU's derivative 53% of copy, GELU 56%)
        eff = min(eff, 0.55)
    seconds = (reads * reread + writes) / (c.bandwidth * eff) + c.launch_s
    return KernelCost(flops, reads * reread + writes, seconds, "memory")


def map_cost(lw: MapLowering, sizes: Mapping[str, int], c: Ceilings) -> KernelCost:
    moved = sum(_bytes(a, sizes) for _, a in lw.loads) + _bytes(lw.out, sizes)
    n = 1
    for e in lw.extents:
        n *= sizes[e]
    return KernelCost(4.0 * n, moved, moved / (c.bandwidth * 0.8) + c.launch_s, "memory")


def loop_iterations(e: Expr, sizes: Mapping[str, int]) -> int:
    """The iterations a thread of a general kernel runs for `e`: a reduction's extents times its body's (at least
    one), sibling reductions added, as the emitted loops run them (attention's derived dK before session 62 had
    a sum over (r, i, d) beside one over (r, i): R·I·D + R·I iterations, which the product of every loop's extent
    counted as R·I·D·R·I, 80 times too many at the example's sizes)."""
    if isinstance(e, Reduce):
        n = 1
        for v in e.vars:
            n *= sizes[v.extent]
        return n * max(1, loop_iterations(e.body, sizes))
    if isinstance(e, Op):
        return sum(loop_iterations(a, sizes) for a in e.args)
    return 0


def general_cost(lw: GeneralLowering, sizes: Mapping[str, int], c: Ceilings) -> KernelCost:
    """Every thread reads its loads once per loop iteration (from L2 at best: counted at bandwidth) and
    does 2 FLOPs per iteration, at the SIMT (fma) rate."""
    n = lw.numel(sizes)
    iterations = loop_iterations(lw.node.rhs, sizes) if lw.loops else 1
    per = sum(DTYPES[a.dtype].bytes for _, a in lw.loads)
    # a scatter's atomicAdd reads the target's lines and writes them back (counted 1.5 times its bytes)
    moved = n * iterations * per + _bytes(lw.out, sizes) * (1.5 if lw.store is Store.ATOMIC_ADD else 1)
    flops = 2.0 * n * iterations
    compute = flops / c.fma_flops
    if not lw.loops:  # each thread evaluates its elements' arithmetic once (H200, 4096 x 14336 bf16, 8-element
        # vectors, 2026-12-02: GELU's derivative, 47 instructions an element, 108.4 µs; GELU, 33, 78.8 µs)
        compute = max(compute, n * element_instructions(lw.node.rhs) / (c.fma_flops / 2))
    # a kernel without loops is a copy (a gather, a scatter-add): latency-bound at one element a thread.
    # H200, 16.7 M elements (2026-12-02): bf16 gathered copy 80.0 µs with one element a thread, 37.4 with 8
    # (0.45 of the copy bandwidth), 15.6 moving 16-byte vectors (the copy bandwidth); f32 scatter-add
    # 122.3 / 94.3 µs, 89.6 moving 4-element vectors (its atomics' read-modify-write: still 0.45)
    eff = 1.0 if lw.loops else 0.45 if lw.kernel.elements >= 4 or lw.vector > 1 else 0.3
    if not lw.loops and lw.store is Store.WRITE and any(
            lw.vector * DTYPES[a.dtype].bytes >= 16 for a in (*(x for _, x in lw.loads), lw.out) if lw.contiguous(a)):
        eff = 0.95
    memory = moved / (c.bandwidth * eff)
    return KernelCost(flops, moved, max(compute, memory) + c.launch_s, "compute" if compute >= memory else "memory")


def columns_cost(lw: ColumnLowering, sizes: Mapping[str, int], target: Target) -> KernelCost:
    """A column reduction streams its rows once: the path's term (habu/paths/columns.py, `seconds`) from
    its bytes in flight per SM, the grid's last wave and the splits' atomic adds."""
    path = path_for(lw.kernel)
    assert isinstance(path, ColumnsPath)
    moved, seconds = path.seconds(lw, sizes, target)
    return KernelCost(2.0 * lw.rows(sizes) * lw.columns(sizes), moved, seconds, "memory")  # (a scalar: one column)


def kernel_cost(lw: Lowering, sizes: Mapping[str, int], target: Target) -> KernelCost:
    """The kernel's cost by its path's family (habu/paths/); a contraction path gives its own terms."""
    c = target.ceilings
    family = path_for(lw.kernel).family
    if family == "contraction":
        return contraction_cost(lw, sizes, target, c)  # type: ignore[arg-type]
    if family == "rows":
        return rows_cost(lw, sizes, c)  # type: ignore[arg-type]
    if family == "general":
        return general_cost(lw, sizes, c)  # type: ignore[arg-type]
    if family == "columns":
        return columns_cost(lw, sizes, target)  # type: ignore[arg-type]
    if family in ("grouped", "attention"):
        flops, moved, seconds = path_for(lw.kernel).seconds(lw, sizes, target)  # type: ignore[attr-defined]
        return KernelCost(flops, moved, seconds, "compute" if flops else "memory")
    return map_cost(lw, sizes, c)  # type: ignore[arg-type]


def plan_cost(model: Model, plan: Plan, target: Target, sizes: Mapping[str, int] | None = None) -> list[KernelCost]:
    s = dict(plan.shape) | dict(sizes or {})
    return [kernel_cost(lw, s, target) for lw in lower_plan(model, plan)]


def roofline_seconds(costs: list[KernelCost], target: Target) -> float:
    """The floor: every kernel at the ceilings (FLOPs at the best instruction, bytes at full bandwidth)."""
    c = target.ceilings
    return sum(max(k.flops / compute_peak(c), k.bytes / c.bandwidth) for k in costs)


def compute_peak(c: Ceilings) -> float:
    """The roofline's FLOP/s: the best instruction's measured ceiling on the target."""
    return c.wgmma_peak or c.mma_sync_flops
