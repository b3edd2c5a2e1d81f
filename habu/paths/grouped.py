"""The grouped-GEMM path: `T[r n] = Σ k A[IX[r] k] · W[E[r] n k]` with E a grouping (the MoE layer's expert
projections), one launch over every group's tiles, mma.sync m16n8k16 on bf16. habu/lower/grouped.py lowers
it (the offsets and the tile scheduler), habu/emit_cuda/emit_grouped.py prints it; its analytic default,
its search space and its cost term are here. A region the path cannot build (a runtime number of groups,
#K not whole 16-byte chunks) gets no default from it: the general family builds it instead.

W stored n-major (`W[E[r] k n]`, a backward's product through the transposed weights) is read only by the wgmma
loop, in 64-column TMA boxes with the transpose bit: its default is the wgmma kernel, and where the target has
no wgmma and TMA the general family builds the region.

The forms beyond the plain GEMM (`GroupedGemm.by_default` false: a row factor P[r], the scatter-add
combine `Y[IX[r] d] += P[r] · Σ h act[r h] · W2[E[r] d h]`, an f32 A) stay in general regions;
`habu.paths.family_kernel` builds them here for the search (`region_space`) and for `--pin family=grouped`.
A model's default plan takes the grouped family for every region it can build (`GroupedPath.default_pins`,
applied by `habu.search.space.default_plan` unless a grouped choice is pinned): on sm_90a the wgmma loop with
gate, up and SwiGLU fused, on sm_80 the mma.sync loop."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import replace

from habu.emit_cuda.emit_grouped import emit_grouped
from habu.emit_cuda.emit_grouped_wgmma import emit_grouped_wgmma
from habu.emit_cuda.emit_grouped_wgrad import emit_grouped_wgrad
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.grouped import GroupedLowering
from habu.lower.grouped_wgmma import WGMMA_BK
from habu.lower.grouped_wgrad import WGRAD_BK, GroupedWgradLowering
from habu.lower.support import GROUPED
from habu.paths.analytic import index_width
from habu.paths.base import KernelPath
from habu.plan.grouped_pair import as_grouped_pair, pair_positions
from habu.plan.grouped_pattern import as_grouped_gemm
from habu.plan.grouped_wgrad import as_grouped_wgrad
from habu.plan.patterns import Region
from habu.plan.plan import GroupedKernel, Kernel
from habu.plan.storage import dtype_of
from habu.spec.dtypes import DTYPES
from habu.spec.ir import INT31_MAX, Model, node_reads
from habu.target import Target
from habu.targets import Ceilings

# the share of the mma.sync peak this kernel's one-stage, register-staged main loop reaches (a guess for
# the cost model until it is measured: no cp.async pipeline, fragments read from shared memory by word)
MMA_SHARE = 0.35
# the share of real wgmma kernels' rate the wgmma main loop reaches (a guess until measured: the
# contraction path's gathered-A wgmma GEMM runs at ~0.8 of it; one tile per block, no persistence)
WGMMA_SHARE = 0.7
# the wgmma main loop's tiles (bm, bn, stages): a stage is bm·128 + bn·128 bytes; 4 × 48 KiB and 6 × 32 KiB
# fit beside the barriers and offsets in the 227 KiB a block may have
WGMMA_TILES = ((128, 256, 4), (128, 128, 6), (64, 256, 4))
# the weight gradient's tiles (bm, bn, stages): a stage is bm·128 bytes of A a part and bn·128 of B (an f32 A's
# two parts: 128 × 128 is 48 KiB; the rules refuse the rings that do not fit)
WGRAD_TILES = ((128, 128, 4), (128, 128, 3), (128, 256, 3), (64, 128, 4), (64, 256, 3), (128, 128, 6))
A_SPLITS = ("consumers", "producer")  # where the wgmma loop splits an f32 A into bf16 parts (`a_split`)
WGRAD_COPIES = ("staged", "cp.async", "registers")  # how the producer moves the operands (`wgrad_copy`)


class GroupedPath(KernelPath):
    support = GROUPED

    def default(self, model: Model, region: Region, target: Target, sizes: dict[str, int]) -> GroupedKernel | None:
        """64 × 64 tiles of 32 k, 2 × 2 warps (each 32 × 32: 2 × 4 mma tiles); 32-bit indices where the
        tensors and the rows a tile computes (#R + 64) stay below 2^31. None where the path cannot build
        the region (the general family then does)."""
        eq = next(e for e in model.nodes if e.target == region.nodes[0])
        gg = as_grouped_gemm(model, eq)
        if gg is None and len(region.nodes) == 1:
            return self.wgrad_default(model, eq, target, sizes)
        if gg is None or len(region.nodes) != 1 or not target.mma_sync:
            return None
        static = model.sizes
        if static.get(gg.group_extent) is None:
            return None  # the offsets live in shared memory, sized by the number of groups
        k = static.get(gg.k.extent) or sizes.get(gg.k.extent)
        if k is None or k % 8:
            return None  # staged as 16-byte chunks of A's and W's rows
        width = index_width(model, sizes)
        if sizes.get(gg.r.extent, 0) + 64 > INT31_MAX:
            width = 64
        kernel = GroupedKernel(nodes=region.nodes, bm=64, bn=64, bk=32, warps_m=2, warps_n=2, index_width=width)
        if gg.w_n_major:  # only the wgmma loop reads an n-major W (64-column TMA boxes, the transpose bit)
            return self.wgmma_kernel(model, kernel, target, sizes)
        return kernel

    def wgrad_default(self, model: Model, eq, target: Target, sizes: dict[str, int]) -> GroupedKernel | None:
        """A grouped weight gradient (`O[E[r] m n] += A[r m] · B[IX[r] n]`, habu/lower/grouped_wgrad.py) on the
        wgmma loop: 128 × 128 tiles of m and n, two consumer warpgroups, as many 64-row k tiles in flight as fit
        (an f32 A's two parts: 48 KiB a stage, 4 stages; a bf16 A: 32 KiB, 6), every operand copied by cp.async
        and an f32 or scaled A converted in place by the consumers (`wgrad_copy` staged: the register route holds one
        k tile in flight a thread and the loop waits on it; H200, 2026-12-05, Mixtral's backward at 4096 tokens:
        dW1 12.8 → 11.6 ms with the bf16 operands copied and an f32 A through registers, 8.35 with a bf16 one,
        `--pin storage=bf16`; cuBLAS 4.3 over the same experts; ncu of the f32 one: 6% of DRAM, 21% of issue
        slots, 68% of the stalls on its loads). The blocks persist (`wgrad_persistent`: one a resident slot, each
        walking the groups' tiles, its producer filling the ring with the next tile's rows while the consumers add
        this one's into O; H100, 2026-12-05, 4096 tokens against torch's expert loop in the same run: dW1 7.11 →
        6.50 ms (torch 4.99), with a bf16 A 4.76 → 4.12 (torch 4.70), dW2 8.06 → 7.79 (4.95); the index ring
        9.15 → 7.11 before it; docs/PERF.md, session 54). None where it cannot run (no wgmma, a runtime number of
        groups, rows not whole 16-byte chunks)."""
        gw = as_grouped_wgrad(model, eq)
        if gw is None or not (target.wgmma and target.setmaxnreg) or model.sizes.get(gw.group_extent) is None:
            return None
        m, n = (model.sizes.get(v.extent) or sizes.get(v.extent) for v in (gw.m, gw.n))
        if m is None or n is None or m % 8 or n % 8:
            return None
        stages = 4 if gw.a_dtype == "f32" else 6
        return GroupedKernel(nodes=(eq.target,), bm=128, bn=128, bk=WGRAD_BK, warps_m=2, warps_n=4,
                             index_width=index_width(model, sizes), main_loop="wgmma", stages=stages,
                             wgrad_copy="staged", wgrad_persistent=True)

    def pair_default(self, model: Model, nodes: tuple[str, str, str], target: Target,
                     sizes: dict[str, int]) -> GroupedKernel | None:
        """The kernel of a pair (gate, up, the node of both: `habu.plan.grouped_pair`): the first GEMM's
        default, computing all three; None where the pair is not one or the path cannot build it."""
        if as_grouped_pair(model, nodes) is None:
            return None
        first = self.default(model, Region("grouped", nodes[:1]), target, sizes)
        return None if first is None else replace(first, nodes=nodes)

    def default_pins(self, model: Model, regions: tuple[Region, ...], target: Target,
                     sizes: dict[str, int]) -> dict[str, str]:
        """The plan choices that make the grouped family a model's default where it has grouped GEMMs (an MoE
        layer: gate, up, the combine with its row factor and scatter-add): `family=grouped` on a target with
        mma.sync; on one with wgmma and TMA the wgmma main loop (`main_loop=wgmma`, where a grouped kernel can
        run it) and gate, up and SwiGLU fused in one kernel (`pair=fused`, where the model has such a pair). The
        exact GPU differential tests of these kernels (tests/gpu/test_grouped*.py) passed before they became the
        default (issue 20 §1: Mixtral at 4096 tokens 0.98-1.01× the best torch baseline, where the general combine
        ran at 0.01-0.19×). {} where no region is grouped."""
        if not target.mma_sync:
            return {}
        chosen = [self.default(model, r, target, sizes) for r in regions if r.kind in ("grouped", "general")]
        chosen = [k for k in chosen if k is not None]
        if not chosen:
            return {}
        pins = {"family": "grouped"}
        # 64-bit indices spill the wgmma loop's consumers (168 registers, 160 B spilled at 128 rows; 232, 80 B
        # at 64): a layer whose wgmma kernels need them stays on the mma.sync loop (102, none). DeepSeek-V3's
        # weights (3.8·10^9 elements a projection) need none on the wgmma loop: TMA loads them by coordinates
        # (`pointer_index_width`), so it takes the wgmma loop with 32-bit indices (its GPU run passed, session
        # 31: 1.31-1.56× the best torch baseline at 128 and 4096 tokens)
        wgmma = [self.wgmma_kernel(model, k, target, sizes) for k in chosen]
        if target.wgmma and target.tma and any(wgmma) and all(k.index_width == 32 for k in wgmma if k is not None):
            pins["main_loop"] = "wgmma"
            pairs = (self.pair_default(model, tuple(n for r in regions[i:i + 3] for n in r.nodes), target, sizes)
                     for i in pair_positions(model, regions))
            if any(p is not None and self.wgmma_kernel(model, p, target, sizes) is not None for p in pairs):
                pins["pair"] = "fused"
        return pins

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        """mma.sync: tiles 32/64/128 rows × 64/128 columns × 32/64 k, 2 × 2, 4 × 2 or 2 × 4 warps (those whose
        warp tiles are whole mma tiles and whose chunks divide among the threads); on a target with wgmma and
        TMA, the wgmma main loop's tiles (`WGMMA_TILES`, each with the 2- and 4-wide epilogue: `store_vector`)
        where it can run the kernel (bf16 A, no pair)."""
        assert isinstance(base, GroupedKernel)
        base = replace(base, main_loop="mma.sync", stages=1)
        for bm, bn, bk, (wm, wn) in itertools.product((32, 64, 128), (64, 128), (32, 64), ((2, 2), (4, 2), (2, 4))):
            k = replace(base, bm=bm, bn=bn, bk=bk, warps_m=wm, warps_n=wn)
            threads = 32 * wm * wn
            if (bm // wm) % 16 or (bn // wn) % 8 or (bm * bk // 8) % threads or (bn * bk // 8) % threads:
                continue
            yield k
        if target.wgmma and target.tma and len(base.nodes) == 3:  # a pair: 128 columns, two boxes a stage
            # each box its own wgmma or one of 256 columns over both; its node's values stored as pairs or
            # traded into 16-byte vectors
            for instructions, vector in itertools.product((2, 1), (2, 8)):
                yield replace(base, main_loop="wgmma", bm=128, bn=128, bk=WGMMA_BK, warps_m=2, warps_n=4, stages=4,
                              pair_wgmmas=instructions, store_vector=vector)
        elif target.wgmma and target.tma:  # each tile with the pairs' epilogue and the 4-wide one
            for (bm, bn, stages), vector in itertools.product(WGMMA_TILES, (2, 4)):
                yield replace(base, main_loop="wgmma", bm=bm, bn=bn, bk=WGMMA_BK, warps_m=bm // 64, warps_n=4,
                              stages=stages, store_vector=vector)

    def region_variants(self, model: Model, region: Region, base: Kernel, target: Target,
                        sizes: dict[str, int]) -> Iterator[Kernel]:
        """`variants`, except where the region's node is a weight gradient (its loop's tiles and rings: `WGRAD_TILES`)
        or a GEMM over n-major weights (the wgmma loop's tiles only: the mma.sync loop cannot read them)."""
        assert isinstance(base, GroupedKernel)
        eq = next((e for e in model.nodes if e.target == base.nodes[0]), None)
        if eq is not None and len(base.nodes) == 1 and as_grouped_wgrad(model, eq) is not None:
            for (bm, bn, stages), copy in itertools.product(WGRAD_TILES, WGRAD_COPIES):
                k = replace(base, main_loop="wgmma", bm=bm, bn=bn, bk=WGRAD_BK, warps_m=bm // 64, warps_n=4,
                            stages=stages, wgrad_copy=copy, wgrad_persistent=False, wgrad_index_ring=True)
                yield k
                if copy == "staged":  # gathers through loads, not the index ring; the walk where it has the tiles
                    yield replace(k, wgrad_index_ring=False)
                    if bn <= 128 or bm == 64:
                        yield replace(k, wgrad_persistent=True)
            return
        gg = as_grouped_gemm(model, eq) if eq is not None and len(base.nodes) == 1 else None
        f32_a = gg is not None and dtype_of(model, gg.a.tensor) == "f32"
        for k in self.variants(base, target):
            if gg is None or not gg.w_n_major or (k.main_loop == "wgmma" and k.bn % 64 == 0):
                if f32_a and k.main_loop == "wgmma":  # an f32 A's split by the producer or the consumers
                    yield from (replace(k, a_split=split) for split in A_SPLITS)
                else:
                    yield k

    def wgmma_kernel(self, model: Model, kernel: GroupedKernel, target: Target,
                     sizes: Mapping[str, int] | None = None) -> GroupedKernel | None:
        """`kernel` on the wgmma main loop, with its default tile (128 × 256 where #N spans several such
        columns and A is bf16, else 128 × 128; the stages that fit) and, given the sizes, the index width of
        what it addresses by pointer (`pointer_index_width`), or None where the loop cannot run it (no wgmma
        or TMA on the target, A or W not bf16)."""
        if not (target.wgmma and target.tma) or len(kernel.nodes) not in (1, 3):
            return None
        # a small batch (at most 64 rows a group on average: decode-size token counts) in 64-row tiles of one
        # consumer warpgroup: half the tensor work on rows past a group's end, the weights still streamed at
        # full rate (the H200, 16 tokens: Mixtral 1.62x/1.55x the best torch baseline in 64-row tiles,
        # 1.57x/1.44x in 128; Qwen3 1.26x/1.25x against 1.19x/1.16x)
        small = sizes is not None and small_batch(model, kernel, sizes)
        if sizes is not None:
            kernel = replace(kernel, index_width=pointer_index_width(model, kernel, sizes))
        if len(kernel.nodes) == 3:  # a fused pair: two accumulators of 128 columns, bf16 A
            pair = as_grouped_pair(model, kernel.nodes)
            if pair is None or dtype_of(model, pair.first.a.tensor) != "bf16":
                return None
            # its node's values stored in 16-byte vectors after the row's lanes trade pairs (where the output is
            # 2-byte, as act is; else the pairs): H200, session 37, Mixtral 4096 tokens, the gate/up kernel
            # 3.31 → 3.11 ms and 3.19 → 2.95 (uniform, zipf routing; the pairs' 4-byte stores used half a sector)
            return replace(kernel, main_loop="wgmma", bm=64 if small else 128, bn=128, bk=WGMMA_BK,
                           warps_m=1 if small else 2, warps_n=4, stages=4, store_vector=8)
        eq = next(e for e in model.nodes if e.target == kernel.nodes[0])
        gg = as_grouped_gemm(model, eq)
        a_dtype = dtype_of(model, gg.a.tensor) if gg is not None else None
        if gg is None or a_dtype not in ("bf16", "f32") or dtype_of(model, gg.w.tensor) != "bf16":
            return None
        n = model.sizes.get(gg.n.extent) or 0
        if gg.w_n_major and n % 8:
            return None  # W's rows along n: TMA's strides are whole 16-byte chunks
        # an f32 A (two bf16 parts, a producer of more registers): 128 columns, the consumers' registers
        bm, bn, stages = WGMMA_TILES[0] if n >= 1024 and a_dtype == "bf16" else WGMMA_TILES[1]
        if a_dtype == "f32":
            # a stage holds A's two parts: 48 KiB; A copied raw by cp.async and split by the consumers in place
            # (`a_split`: the producer's registers held two k tiles in flight, and its loads' latency stalled the
            # loop: ncu, H200, 2026-12-05, the Mixtral backward's f32-A products at 163 TFLOP/s of useful work)
            return replace(kernel, main_loop="wgmma", bm=64 if small else bm, bn=bn, bk=WGMMA_BK,
                           warps_m=(64 if small else bm) // 64, warps_n=4, stages=4, a_split="consumers")
        if small:
            bm = 64
        return replace(kernel, main_loop="wgmma", bm=bm, bn=bn, bk=WGMMA_BK, warps_m=bm // 64, warps_n=4,
                       stages=stages)

    def seconds(self, lw: GroupedLowering, sizes: Mapping[str, int], target: Target) -> tuple[float, float, float]:
        """(FLOPs, bytes moved, seconds): the row tiles of an even grouping (#R/#G rows a group), each
        reading its A rows once per column tile and the groups' weights once, at MMA_SHARE of mma.sync.
        A weight gradient: `wgrad_seconds`."""
        c = target.ceilings
        if isinstance(lw, GroupedWgradLowering):
            return wgrad_seconds(lw, sizes, c)
        R, N, K, G = (sizes[x] for x in (lw.r, lw.n, lw.k, lw.g))
        k = lw.kernel
        tiles_m = G * -(-max(1, R // max(G, 1)) // k.bm)
        tiles_n = -(-N // k.bn)
        gemms = 1 if lw.pair is None else 2  # a pair: two accumulators over the same A tile
        flops = 2.0 * tiles_m * k.bm * tiles_n * k.bn * K * lw.a_parts * gemms  # an f32 A: an mma per bf16 part
        moved = 2.0 * (R * K * tiles_n * lw.a_parts + G * N * K * gemms) + 4.0 * R * N
        peak = c.wgmma_flops * WGMMA_SHARE if lw.uses_wgmma else (c.mma_sync_flops or c.fma_flops) * MMA_SHARE
        return flops, moved, max(flops / peak, moved / c.bandwidth) + c.launch_s

    def smem_bytes(self, lowering: GroupedLowering) -> int:  # type: ignore[override]
        return lowering.smem_bytes()

    def registers(self, lowering: GroupedLowering) -> int:  # type: ignore[override]
        return 0

    def emit(self, name: str, model: Model, lowering: GroupedLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        if isinstance(lowering, GroupedWgradLowering):
            return emit_grouped_wgrad(name, model, lowering, static)
        if lowering.uses_wgmma:
            return emit_grouped_wgmma(name, model, lowering, static)
        return emit_grouped(name, model, lowering, static)


# The grouped weight gradient's variants against a block a tile (staged copies, the index ring; 128 × 128). H100,
# 2026-12-05, Mixtral's dW1 (f32 and bf16 A) and dW2 at 4096 tokens, timed in one run (docs/PERF.md, session 54):
# the walk 1.04–1.16× (`WALK_GAIN`); without the index ring, a gathered side's copies waiting on their loads of
# IX[r], 0.61–0.78× (`NO_RING`); 64-row tiles under the walk 0.75–0.88× of the walk (`NARROW`). H200, session 51:
# the producer's registers for an f32 A 0.88× staged copies (`UNSTAGED`).
WALK_GAIN, NO_RING, NARROW, UNSTAGED = 1.1, 0.7, 0.8, 0.88


def wgrad_seconds(lw: GroupedWgradLowering, sizes: Mapping[str, int], c: Ceilings) -> tuple[float, float, float]:
    """(FLOPs, DRAM bytes, seconds) of a weight gradient: every group's rows copied from the L2 once per output tile
    (A's once per column tile, B's once per row tile: at the cp.async rate), A, B and the row factor read from DRAM
    once, O read and written once; at the variant's share of that (`wgrad_efficiency`). With sm_90a's ceilings (the
    H200's) this gives Mixtral's dW1 at 4096 tokens under the walk 3.37 ms with a bf16 A and 4.66 with an f32 A,
    where an H100 (less bandwidth) measured 4.12 and 6.50 (2026-12-05): the copies from the L2 bound it, not the
    tensor cores (233 TFLOP/s measured; the FLOPs alone at the wgmma rate would be 1.6 ms)."""
    R, M, N, G = (sizes[x] for x in (lw.r, lw.m, lw.n, lw.g))
    k = lw.kernel
    tiles_m, tiles_n = -(-M // k.bm), -(-N // k.bn)
    a_bytes = DTYPES[lw.a.dtype].bytes
    flops = 2.0 * R * tiles_m * k.bm * tiles_n * k.bn * lw.a_parts
    from_l2 = R * (M * tiles_n * a_bytes + N * tiles_m * 2.0)
    dram = R * (M * a_bytes + N * 2.0) + 8.0 * G * M * N
    streams = from_l2 / c.cp_async_bandwidth + dram / c.bandwidth
    return flops, dram, max(flops / (c.wgmma_flops * WGMMA_SHARE), streams) / wgrad_efficiency(lw) + c.launch_s


def wgrad_efficiency(lw: GroupedWgradLowering) -> float:
    """The share of the weight gradient's wgmma rate this kernel's variant reaches, against the default's (1.0):
    what lets the cost model rank the walk, the index ring, the tile and the copy route, which it would otherwise
    price alike (their FLOPs and bytes are the same)."""
    k, loop = lw.kernel, lw.loop
    share = WALK_GAIN if k.wgrad_persistent else 1.0
    gathered = any(lw.row_tables(side) for side in ("A", "B"))
    if gathered and (loop is None or not loop.index_sides):
        share *= NO_RING
    if k.bm < 128:
        share *= NARROW
    if k.wgrad_copy != "staged":
        share *= UNSTAGED
    return share


def small_batch(model: Model, kernel: GroupedKernel, sizes: Mapping[str, int]) -> bool:
    """Whether the kernel's groups hold at most 64 rows on average (#R ≤ 64·#G)."""
    eq = next(e for e in model.nodes if e.target == kernel.nodes[0])
    gg = as_grouped_gemm(model, eq)
    if gg is None or gg.r.extent not in sizes or gg.group_extent not in sizes:
        return False
    return sizes[gg.r.extent] <= 64 * sizes[gg.group_extent]


def pointer_index_width(model: Model, kernel: GroupedKernel, sizes: Mapping[str, int]) -> int:
    """The wgmma loop's index width: 32 where every tensor its threads address by pointer arithmetic (A and
    its gather table, the grouping, the row factor, the output and its scatter table: each node's reads and
    target) has at most 2^31 − 1 elements and a tile's rows (#R + bm) stay below 2^31, else 64. The weights
    are not among them: TMA loads their boxes by 32-bit coordinates (each below its extent) and the copy
    engine forms the addresses (the rules check W's accesses in 64 bits: `GroupedLowering.weights_width`)."""
    weights = set()
    tensors: set[str] = set()
    for name in kernel.nodes:
        eq = next(e for e in model.nodes if e.target == name)
        gg = as_grouped_gemm(model, eq)
        if gg is not None:
            weights.add(gg.w.tensor)
        tensors |= node_reads(eq) | {eq.target}
    for t in tensors - weights:
        n = 1
        for e in model.tensor(t).extents:
            n *= sizes[e]
        if n > INT31_MAX:
            return 64
    first = next(e for e in model.nodes if e.target == kernel.nodes[0])
    gg = as_grouped_gemm(model, first)
    rows = sizes[gg.r.extent] if gg is not None else 0
    return 64 if rows + kernel.bm > INT31_MAX else 32


PATH = GroupedPath()
