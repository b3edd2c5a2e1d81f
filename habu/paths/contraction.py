"""What the three contraction paths (fma, mma.sync, wgmma) share: the analytic default (each path
says whether it takes a contraction and how its operands move), the search space's shape of a
contraction variant, the shared-memory layout, and the cost model's terms, each path filling in its
own tables."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from habu.lower.contraction import ContractionLowering
from habu.lower.support import (
    TENSOR_CORE_DTYPES,
    ContractionSupport,
    contraction_smem,
    lowering_smem,
    support_for,
)
from habu.paths.analytic import index_width, max_vector, node_of
from habu.paths.base import KernelPath
from habu.paths.l2_keep import keeps_operands
from habu.plan.column_epilogue import chain_end
from habu.plan.patterns import Contraction, Operand, Region, as_contraction, kernel_contraction
from habu.plan.plan import MOVEMENTS, RASTERS, ContractionKernel, Kernel
from habu.plan.storage import dtype_bytes, dtype_of
from habu.spec.ir import Model
from habu.target import Target
from habu.targets import Ceilings

Shape = tuple[int, int, int, int, int]  # tile_m, tile_n, tile_k, warps, stages
# split-K factors the search tries (8 for skinny contractions' 64-row tiles only: wide tiles to one wave)
SPLITS = (1, 2, 4, 8)
# the consumer lag the search tries (`consumer_lag`): k tiles one warpgroup runs ahead of the next, so the first's
# epilogue overlaps the second's last k tiles (about an epilogue's time of a skinny product's k tiles)
LAG_TILES = 2
Schedule = tuple[tuple[int, int, int], int, int]  # (tile_m, tile_n, tile_k), warps, stages

# a contraction of at most this many output rows is skinny (decode: 1 to 128 tokens through a layer's
# weights): its time is the weights' bytes streamed once, so its default has narrow tiles and enough
# blocks (tiles x splits) in flight to keep every SM's loads going
SKINNY_ROWS = 128
# A skinny default's blocks: a wgmma block holds its SM alone (one block of ~200 KB of ring per SM),
# so the blocks of one wave are the blocks in flight. Its tiles narrow until one wave gives at least
# SKINNY_FILL of the SMs a block (FFN-SKIP's 16 x 14336: 112 tiles of 128 columns, one wave, rather
# than 224 of 64 in 1.7 waves of the same bytes per SM), but never under the rows that read A (each
# tile re-reads A's rows: A's traffic over B's is M / tile_n); a split-K one (f32 output, linear
# epilogue) keeps SKINNY_SPLIT_WIDTH-wide tiles, where A's re-reads and the partials' atomic traffic
# balance (GGEMM 64x4096x4096: A 16 MB + atomics 4 MB against B's 32 MB), and splits K until one wave
SKINNY_FILL = 0.8
SKINNY_SPLIT_WIDTH = 128
SKINNY_BLOCKS_PER_SM = 1
# k tiles of one split at least (a split's prologue and combine stay small). H200, 2026-12-01, GGEMM
# 64x4096x4096 (habu.bench.decode_speed): 64x128 s8 split 4 (16 k tiles a split) 20.8 µs, split 2 19.6 µs
SKINNY_MIN_K_TILES = 32
# a skinny default of at most this many rows may split by a cluster of 2 (`skinny_cluster_split`)
CLUSTER_SPLIT_ROWS = 64


def target_moves(target: Target) -> list[str]:
    """The operand movements the target has."""
    return [m for m in MOVEMENTS if m == "ldg" or (m == "cp.async" and target.cp_async)
            or (m == "tma" and target.tma) or (m == "tma-gather4" and target.tma_gather4)]


def batch_innermost(c: Contraction, operand: Operand) -> bool:
    """Whether the operand's innermost index is one of the product's batch axes (`A[m k s]`, s batched): no vector
    runs along it, and TMA reads it only once a staging pass has copied it k-major."""
    return operand.load.indices[-1] in c.batch


def _batch_read(c: Contraction, operand: Operand) -> int:
    """How many of the product's batch axes the operand reads (a weight shared by every batch reads none)."""
    return sum(1 for v in c.batch if v in operand.load.indices)


@dataclass(frozen=True)
class ContractionFacts:
    """What the analytic defaults read of one contraction region at a shape."""

    c: Contraction
    tensor_cores: bool  # bf16/f16 operands of one type
    m: int
    n: int
    k: int
    a_kmajor: bool
    b_kmajor: bool
    b_n_major_tma: bool  # a B contiguous along n (a (K, N) weight) that TMA boxes can read transposed
    batches: int = 1  # a batched contraction's products (the grid holds this many output grids)
    a_m_major_tma: bool = False  # an A contiguous along m (stored [k m]) that TMA boxes can read transposed

    def stageable(self, rows: int, target: Target) -> bool:
        """Whether a staging pass can copy an operand of `rows` rows: a block row per row (grid.y) and a slab of
        blocks per batch (grid.z)."""
        return rows <= target.max_grid_yz and self.batches <= target.max_grid_yz

    @staticmethod
    def of(model: Model, region: Region, target: Target, sizes: dict[str, int], swap: bool = False
           ) -> ContractionFacts:
        """`swap`: the facts of the product as a `swap_ab` kernel computes it (m along the output's columns)."""
        c = as_contraction(node_of(model, region.nodes[0]))
        assert c is not None
        if swap:
            c = c.swapped()
        a_t, b_t = c.a.load.tensor, c.b.load.tensor
        a_dt, b_dt = dtype_of(model, a_t), dtype_of(model, b_t)
        # an operand gathered on k is staged k-major (`_staged`'s transposing pass) before the main loop reads it
        b_kmajor = c.b.k_pos == len(c.b.load.indices) - 1 or c.b.k_gather is not None
        b_decl = model.tensor(b_t)
        # (an operand shared by some batch axes, K[b g j e] of dQ[b g r i e], has a box of 1 on the axes it reads)
        b_n_major_tma = (not b_kmajor and c.b.gather is None and len(c.b.load.indices) == 2 + _batch_read(c, c.b)
                         and c.b.load.indices[-1] == c.n  # its innermost index n (not a batch axis)
                         and target.tma and dtype_bytes(model, b_t) == 2 and (sizes[b_decl.extents[-1]] * 2) % 16 == 0)
        batches = 1
        for v in c.batch:
            batches *= sizes[v.extent]
        a_kmajor = c.a.k_pos == len(c.a.load.indices) - 1 or c.a.k_gather is not None
        a_decl = model.tensor(a_t)
        a_m_major_tma = (not a_kmajor and c.a.gather is None and len(c.a.load.indices) == 2 + _batch_read(c, c.a)
                         and c.a.load.indices[-1] == c.m  # its innermost index m (not a batch axis)
                         and target.tma and dtype_bytes(model, a_t) == 2 and (sizes[a_decl.extents[-1]] * 2) % 16 == 0)
        return ContractionFacts(c, a_dt in TENSOR_CORE_DTYPES and a_dt == b_dt, sizes[c.m.extent],
                                sizes[c.n.extent], sizes[c.k.extent], a_kmajor, b_kmajor, b_n_major_tma, batches, a_m_major_tma)


@dataclass(frozen=True)
class OperandFacts:
    """What an operand's default movement depends on."""

    is_b: bool
    gathered: bool
    contiguous_k: bool  # its rows run along k
    row_elems: int  # its row length in elements (row-major storage)
    elem_bytes: int
    rows: int  # the rows of the output it feeds (#M for A, #N for B)
    k_gathered: bool = False  # gathered on the reduction axis (`A[IX[m] k]`, m summed): read through a staging pass
    batch_innermost: bool = False  # its innermost index is a batch axis (`A[m k s]`, s batched)

    @property
    def aligned_rows(self) -> bool:
        """Rows of a 16-byte multiple (a TMA descriptor's stride)."""
        return (self.row_elems * self.elem_bytes) % 16 == 0


class ContractionPath(KernelPath):
    """A contraction path: subclasses give the tables below; `variants` combines them."""

    support: ContractionSupport
    swizzled = False  # whether its default swizzles shared memory even without TMA operands

    @property
    def mma(self) -> str:
        return self.support.mma

    # ------------------------------------------------------------------ the analytic default

    def takes(self, facts: ContractionFacts, target: Target) -> bool:
        """Whether the analytic default uses this path for the contraction (asked by preference)."""
        raise NotImplementedError

    def default_movement(self, op: OperandFacts, vector: int, facts: ContractionFacts, target: Target
                         ) -> tuple[str, int]:
        """How the default moves an operand, and its vector (`vector`: the widest aligned one)."""
        raise NotImplementedError

    def default_warp_specialized(self, target: Target) -> bool:
        return False

    def default_persistent(self, k_tiles: int, tiles: int, split: int, target: Target,
                           moves: tuple[str, str] = ("tma", "tma")) -> bool:
        """Whether the default walks tiles persistently (each block many tiles: one tile's epilogue
        overlaps the next one's loads). No, unless a path says so."""
        return False

    def tile_schedule(self, tile_m: int, tile_n: int) -> tuple[int, int] | None:
        """The (warps, stages) a pinned tile brings with it, or None (the default's are kept)."""
        return None

    def default(self, model: Model, region: Region, target: Target, sizes: dict[str, int],
                forced: bool = False) -> ContractionKernel | None:
        """The analytic default with this path's instruction (`forced`: even where `takes` says no,
        for `--pin mma=...`)."""
        facts = ContractionFacts.of(model, region, target, sizes)
        if not forced and not self.takes(facts, target):
            return None
        c = facts.c
        out_dt = model.tensor(chain_end(model, region.nodes)).dtype  # (a column sum after it: its chain's end)
        # split-K adds partials atomically: a lone contraction into f32 (the `split-k-linear` rule)
        splittable = len(region.nodes) == 1 and out_dt is not None and out_dt.name == "f32"
        # a batched contraction's products fill the GPU together: its rows count once per batch
        rows = facts.m * facts.batches
        skinny = self.skinny_schedule(facts, target, splittable) if rows <= SKINNY_ROWS else None
        reduce = "atomic"
        plain = not c.batch and node_of(model, chain_end(model, region.nodes)).scatter is None and c.by_default
        swap = plain and self.swaps(facts, target)
        if swap:  # the weights along the tile's rows, the few tokens along its columns
            facts = ContractionFacts.of(model, region, target, sizes, swap=True)
            c = facts.c
            skinny, reduce = self.swapped_schedule(facts, target)
        # (a batched contraction and a scatter-add run without cluster splits: `_split_cluster_refusals`)
        elif skinny is not None and plain:
            skinny, reduce = self.skinny_cluster_split(facts, target, splittable, skinny)
        tile, warps, stages = skinny[0] if skinny else self.default_schedule(rows, facts.n, target, facts.k)

        def movement(op: Operand, tile_along_inner: int) -> tuple[str, int]:
            decl = model.tensor(op.load.tensor)
            eb = dtype_bytes(model, op.load.tensor)
            inner = sizes[decl.extents[-1]]
            # vectors run along the innermost index where it is k or the operand's row axis; one whose innermost
            # index is a batch axis (`A[m k s]`, s batched) is read an element at a time
            along = op.load.indices[-1] in (c.k, op.axis_var) or op.k_pos == len(op.load.indices) - 1
            vec = max_vector(inner, eb) if along else 1
            while tile_along_inner % vec:
                vec //= 2
            facts_op = OperandFacts(op is c.b, op.gather is not None, op.k_pos == len(op.load.indices) - 1, inner,
                                    eb, sizes[(c.m if op is c.a else c.n).extent], op.k_gather is not None,
                                    batch_innermost(c, op))
            return self.default_movement(facts_op, vec, facts, target)

        a_move, a_vec = movement(c.a, tile[2] if c.a.k_pos == len(c.a.load.indices) - 1 else tile[0])
        b_move, b_vec = movement(c.b, tile[2] if c.b.k_pos == len(c.b.load.indices) - 1 else tile[1])
        tiles = -(-facts.m // tile[0]) * -(-facts.n // tile[1]) * facts.batches
        split = 1
        if skinny:
            split = skinny[1]
        elif splittable:
            while tiles * split * 2 <= target.sm_count and -(-facts.k // tile[2]) >= 8 * split * 2:
                split *= 2
        k_tiles = -(-facts.k // tile[2])
        persistent = self.default_persistent(k_tiles, tiles, split, target, (str(a_move), str(b_move)))
        if persistent:  # the ring runs on across tiles: a stage past the tile's k loop is enough (H200,
            # 2026-12-02, batched scores 32x2048x2048x128, 2 k tiles, 128x256 persistent: 88.0 µs with 3
            # stages, 93.5-96.2 with 4; torch.bmm 88.4)
            stages = max(2, min(stages, k_tiles + 1))
        eb = max(dtype_bytes(model, c.a.load.tensor), dtype_bytes(model, c.b.load.tensor))
        swizzle = 128 if tile[2] * eb >= 128 else (64 if tile[2] * eb >= 64 else 0)
        kernel = ContractionKernel(
            nodes=region.nodes, tile_m=tile[0], tile_n=tile[1], tile_k=tile[2], warps=warps, stages=stages,
            mma=self.mma, a_move=a_move, b_move=b_move, a_vector=a_vec, b_vector=b_vec, split_k=split,
            # grouped raster: 16 tile rows share B in L2 on tall problems (H200, 2026-11-30, MoE 8192x14336x4096:
            # 701 TFLOP/s with 16, 684 with 8), 8 otherwise
            raster="row", group_m=16 if -(-facts.m // tile[0]) >= 64 else 8,
            persistent=persistent, split_reduce=reduce,
            warp_specialized=self.default_warp_specialized(target),
            swizzle=swizzle if "tma" in (a_move, b_move) or self.swizzled else 0,
            accumulator="f32", index_width=index_width(model, sizes), swap_ab=swap,
            a_ahead=swap and weights_ahead(model, c),
        )
        if plain_output(model, region, c, target, sizes) and (skinny or tma_store_fits(model, kernel, target)):
            kernel = replace(kernel, store="tma")
        if kernel.store == "tma" and reads_early(model, replace(kernel, epilogue_early=True)):
            # the epilogue's loads of model inputs at each tile's start (H100, 2026-12-05: FFN-SKIP's 128-token
            # step 336.5 → 332.7 µs, dT2's product 57.7 → 54.4, outputs bitwise the same; docs/PERF.md, session 57)
            kernel = replace(kernel, epilogue_early=True)
        if skinny:  # as deep as shared memory holds (TMA stores kept where they fit)
            kernel = fit_stages(model, kernel, target)
        if keeps_operands(model, kernel, (c.a.load.tensor, c.b.load.tensor), target, sizes):
            kernel = replace(kernel, keep_operands=True)  # small operands, an output past the L2 (habu/paths/l2_keep.py)
        if skips_zero(model, kernel):
            kernel = replace(kernel, skip_zero=True)  # k tiles the model makes zero skipped (habu/lower/k_bounds.py)
        return kernel

    # ------------------------------------------------------------------ skinny contractions

    def skinny_tile_ms(self, m: int) -> tuple[int, ...]:
        """The tile rows a skinny default (at most SKINNY_ROWS output rows) tries, in order: the first
        whose tiles fill a wave is taken, else the last. Empty: the path has no skinny default and
        uses `default_schedule`."""
        return ()

    def skinny_widths(self, facts: ContractionFacts) -> tuple[int, ...]:
        """The tile widths a skinny default may take, widest first (the narrowest the path prints last)."""
        return ()

    def skinny_warps_stages(self, tile_m: int, tile_n: int, tile_k: int, b_bytes: int) -> tuple[int, int]:
        """The warps and the (largest wanted) pipeline depth of a skinny tile; `fit_stages` then
        shortens the ring to what shared memory holds."""
        raise NotImplementedError

    skinny_tile_k = 64  # 128-byte rows of 16-bit weights: whole lines per load

    def skinny_schedule(self, facts: ContractionFacts, target: Target, splittable: bool
                        ) -> tuple[Schedule, int] | None:
        """The default of a skinny contraction, (schedule, split_k), or None (the path has none).

        The weights (B) dominate: each is streamed once at the copy bandwidth when enough blocks are
        in flight, each with a deep ring (`skinny_warps_stages`). The widths (see SKINNY_FILL above):
        the widest that fills a wave, down to the narrowest at least as wide as the rows that read
        A; split-K ones take SKINNY_SPLIT_WIDTH (or the widest that fills a wave, if narrower) and
        split until one wave. Taller tiles first (`skinny_tile_ms`): two consumer warpgroups share
        one B tile, where tall tiles still fill a wave."""
        tile_ms, path_widths = self.skinny_tile_ms(facts.m), self.skinny_widths(facts)
        if not tile_ms or not path_widths:
            return None
        k_tiles = -(-facts.k // self.skinny_tile_k)
        for tile_m in tile_ms:
            tiles_m = -(-facts.m // tile_m)
            rows = min(facts.m, tile_m)
            widths = tuple(w for w in path_widths if w >= rows) or path_widths[:1]
            if splittable:
                widths = tuple(w for w in widths if w <= SKINNY_SPLIT_WIDTH) or widths[-1:]
            tile_n = next((w for w in widths if tiles_m * -(-facts.n // w) >= SKINNY_FILL * target.sm_count),
                          widths[0] if splittable else widths[-1])
            tiles = tiles_m * -(-facts.n // tile_n)
            if splittable or tiles >= SKINNY_FILL * target.sm_count:
                break
        split = 1
        while splittable and tiles * split * 2 <= SKINNY_BLOCKS_PER_SM * target.sm_count \
                and k_tiles >= SKINNY_MIN_K_TILES * split * 2:
            split *= 2
        b_bytes = 2 if facts.tensor_cores else 4
        warps, stages = self.skinny_warps_stages(tile_m, tile_n, self.skinny_tile_k, b_bytes)
        return ((tile_m, tile_n, self.skinny_tile_k), warps, stages), split

    def skinny_cluster_split(self, facts: ContractionFacts, target: Target, splittable: bool,
                             skinny: tuple[Schedule, int]) -> tuple[tuple[Schedule, int], str]:
        """A skinny default of at most CLUSTER_SPLIT_ROWS rows whose tiles leave SMs idle: tiles half as
        wide, split in two by a cluster of 2 (habu/lower/split_cluster.py: the partials meet in shared
        memory, any epilogue, no zero fill), where that doubles the blocks within one wave and each split
        keeps enough k tiles. Clusters of 2 because a wave of them fills every SM (66 on the H200);
        clusters of 4 or 8 ran 128 blocks in two waves (H200, 2026-12-02, habu.bench.decode_speed: GGEMM
        64x4096x4096 64x128 split 4 24.4 µs against split 2 17.8). Measured the same day: GGEMM
        64x4096x4096 64x64 split 2 16.3 µs against the atomic 64x128 split 2 19.5; FFN-SKIP at 16 tokens
        with its down projection 64x64 split 2 82.5 µs against 64x128 86.3; RMSNorm+Linear at 16 tokens
        (K 4096: 32 k tiles a split) 18.4 against 17.6 unsplit, hence the longer k loop asked of a
        contraction that has no atomic split to replace."""
        ((tile_m, tile_n, tile_k), _warps, _stages), _split = skinny
        if not self.cluster_splits(target) or facts.m > CLUSTER_SPLIT_ROWS:
            return skinny, "atomic"
        tiles_m = -(-facts.m // tile_m)
        narrow = tile_n // 2
        tiles = tiles_m * -(-facts.n // narrow)
        k_tiles = -(-facts.k // tile_k)
        least = SKINNY_MIN_K_TILES if splittable else 2 * SKINNY_MIN_K_TILES
        if (tiles_m * -(-facts.n // tile_n) >= SKINNY_FILL * target.sm_count or narrow < min(facts.m, tile_m)
                or (not facts.b_kmajor and narrow % 64) or narrow < 16
                or tiles * 2 > target.sm_count or k_tiles < 2 * least):
            return skinny, "atomic"
        b_bytes = 2 if facts.tensor_cores else 4
        warps, stages = self.skinny_warps_stages(tile_m, narrow, tile_k, b_bytes)
        return (((tile_m, narrow, tile_k), warps, stages), 2), "cluster"

    def swaps(self, facts: ContractionFacts, target: Target) -> bool:
        """Whether the default computes the product transposed (`swap_ab`): no, unless a path says so."""
        return False

    def swapped_schedule(self, facts: ContractionFacts, target: Target) -> tuple[tuple[Schedule, int], str]:
        """A transposed skinny product's ((tile, warps, stages), split_k) and split reduction, `facts` being the
        swapped product's (m: the weights' side, n: the few tokens)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the search space

    def offered(self, target: Target, tensor_cores: bool) -> bool:
        """Whether the search tries this path for a contraction (`tensor_cores`: bf16/f16 operands)."""
        raise NotImplementedError

    def default_schedule(self, m: int, n: int, target: Target, k: int = 0) -> tuple[tuple[int, int, int], int, int]:
        """The analytic default's (tile, warps, stages) for an M x N output summing K terms (0: not known)."""
        raise NotImplementedError

    def shapes(self) -> list[Shape]:
        """The (tile_m, tile_n, tile_k, warps, stages) choices its emitter supports."""
        raise NotImplementedError

    def skinny_shapes(self) -> list[Shape]:
        """Further shapes tried for skinny contractions (at most SKINNY_ROWS rows): narrow, deep."""
        return []

    def swapped_shapes(self) -> list[Shape]:
        """Shapes tried transposed (`swap_ab`: tile_m along the weights, tile_n along the few tokens) for skinny
        contractions; none unless a path prints them."""
        return []

    def movements(self, moves: list[str]) -> list[tuple[str, str]]:
        """(A, B) movements tried, out of the target's `moves`."""
        raise NotImplementedError

    def stores(self, target: Target) -> tuple[str, ...]:
        return ("direct",)

    def clusters(self, target: Target) -> tuple[int, ...]:
        return (1,)

    def cluster_splits(self, target: Target) -> bool:
        """Whether the path prints a cluster split (habu/lower/split_cluster.py) on the target."""
        return False

    def vector(self, move: str, vector: int) -> int:
        """The vector width an operand moved by `move` gets, `vector` being the widest aligned one."""
        return vector

    def reads_boxes(self, move: str) -> bool:
        """Whether an operand moved by `move` is read by TMA in whole boxes (no vector width of its own)."""
        return move in ("tma", "tma_gather4")

    def b_ahead_offered(self, kernel: ContractionKernel) -> bool:
        """Whether the search also tries `kernel` with B's first boxes ahead (`b_ahead`)."""
        return False

    def lag_offered(self, kernel: ContractionKernel) -> bool:
        """Whether the search also tries `kernel` with its consumer warpgroups staggered (`consumer_lag`)."""
        return False

    def fixed_fields(self, target: Target) -> dict[str, object]:
        """Kernel fields the path fixes (warp specialisation, swizzle)."""
        return {"warp_specialized": False, "swizzle": 0}

    def variants(self, base: Kernel, target: Target, row_length: int | None = None,
                 skinny: bool = False) -> Iterator[Kernel]:
        """`skinny`: the contraction has at most SKINNY_ROWS rows (the skinny shapes and split 8 too)."""
        assert isinstance(base, ContractionKernel)
        if base.swap_ab:  # (a transposed default: the variants below are of the product as written)
            base = base.transposed()
        shapes = self.shapes() + (self.skinny_shapes() if skinny else [])
        splits = SPLITS if skinny else tuple(s for s in SPLITS if s <= 4)
        for (bm, bn, bk, warps, stages), (am, bmv), split, raster, group, persistent, store, cluster in \
                itertools.product(shapes, self.movements(target_moves(target)), splits, RASTERS, (1, 8),
                                  (False, True), self.stores(target), self.clusters(target)):
            if cluster > 1 and (bmv != "tma" or split > 1 or not persistent):
                # a cluster multicasts B by TMA, without split-K (the rules say so of pins); the
                # search tries it on persistent plans alone: on the H200 a cluster of 2 timed the same
                # as one block (GGEMM 4096³ 182.1 vs 183.4 µs, GEMM 8192³ 1373.7 vs 1365.2, 2026-11-30)
                continue
            if split > 4 and bm > 64:
                continue  # split 8 is for skinny 64-row tiles (taller ones fill a wave by split 4)
            kernel = replace(base, mma=self.mma, tile_m=bm, tile_n=bn, tile_k=bk, warps=warps, stages=stages,
                             a_move=am, b_move=bmv, a_vector=self.vector(am, base.a_vector),
                             b_vector=self.vector(bmv, base.b_vector), split_k=split,
                             raster=raster, group_m=group, persistent=persistent, **self.fixed_fields(target),
                             store=store, cluster_m=cluster, split_reduce="atomic", swap_ab=False)
            yield kernel
            clustered = None
            if skinny and split > 1 and self.cluster_splits(target) and not persistent and store == "direct" \
                    and cluster == 1:  # a skinny contraction's splits with any epilogue: the partials meet in a cluster
                clustered = replace(kernel, split_reduce="cluster")
                yield clustered
            if self.lag_offered(kernel):  # one consumer's epilogue beside the other's last k tiles (or MMAs)
                yield replace(kernel, consumer_lag=LAG_TILES)
            if skinny and self.b_ahead_offered(kernel):  # B's first boxes before everything else
                yield replace(kernel, b_ahead=True)
                if clustered is not None:
                    yield replace(clustered, b_ahead=True)
        if skinny:
            yield from self._swapped_variants(base, target)

    def _swapped_variants(self, base: ContractionKernel, target: Target) -> Iterator[ContractionKernel]:
        """A skinny contraction transposed (`swap_ab`): the weights by TMA along the tile's rows, the tokens by TMA
        or cp.async (gathered) along its columns, unsplit or split by a cluster of 2 or 4, direct stores, the
        weights' first boxes ahead of the wait for the previous kernel or not (`a_ahead`). `base`:
        as written (its B the weights, whose vector the transposed A takes)."""
        moves = [(a, b) for a, b in self.movements(target_moves(target)) if a == "tma" and b in ("tma", "cp.async")]
        splits = [(1, "atomic")] + ([(2, "cluster"), (4, "cluster")] if self.cluster_splits(target) else [])
        for (bm, bn, bk, warps, stages), (am, bmv), (split, reduce), ahead in itertools.product(
                self.swapped_shapes(), moves, splits, (False, True)):
            yield replace(base, mma=self.mma, tile_m=bm, tile_n=bn, tile_k=bk, warps=warps, stages=stages,
                          a_move=am, b_move=bmv, a_vector=self.vector(am, base.b_vector),
                          b_vector=self.vector(bmv, base.a_vector), split_k=split, raster="row", group_m=1,
                          persistent=False, **self.fixed_fields(target), store="direct", cluster_m=1,
                          split_reduce=reduce, b_ahead=False, a_ahead=ahead, swap_ab=True)

    # ------------------------------------------------------------------ resources

    def smem_bytes(self, lowering: ContractionLowering) -> int:  # type: ignore[override]
        lw = lowering
        return lowering_smem(lw).total

    def registers(self, lowering: ContractionLowering) -> int:  # type: ignore[override]
        return self.support.registers(lowering.kernel)

    # ------------------------------------------------------------------ the cost model's terms

    def peak_flops(self, c: Ceilings) -> float:
        """The FLOP/s the path's instruction reaches in real kernels on the target."""
        raise NotImplementedError

    ldg_feed = 1.0  # how much slower the main loop runs when an operand is loaded by plain ldg

    def stage_efficiency(self, kernel: ContractionKernel, a_bytes: int, b_bytes: int) -> float:
        """The fraction of the peak the pipeline's depth allows."""
        return min(1.0, 0.7 + 0.1 * kernel.stages)


def weights_ahead(model: Model, c: Contraction) -> bool:
    """Whether a transposed product's weights (its A, a model input) go ahead of the wait for the plan's
    previous kernel (`a_ahead`): where its tokens (B) are another kernel's output, so the product starts early
    (programmatic dependent launch) and its weights stream while that kernel runs. H200, 2026-12-04
    (habu.bench.decode_speed): RMSNorm+Linear at 16 tokens 15.6 -> 14.7 µs, FFN-SKIP 67.5 -> 66.2; GGEMM (its
    tokens an input, no earlier kernel) 14.8 -> 15.3, so not there."""
    inputs = {t.name for t in model.inputs}
    return c.a.load.tensor in inputs and c.b.load.tensor not in inputs


def plain_output(model: Model, region: Region, c: Contraction, target: Target, sizes: dict[str, int]) -> bool:
    """TMA stores where the output is a plain row-major (m, n) matrix with 16-byte rows (H200,
    4096³: bf16 GEMM 0.90 -> 0.99x cuBLAS, f32 GGEMM 184.5 -> 181.1 µs)."""
    end = chain_end(model, region.nodes)  # the stored product (a column sum in its epilogue stores apart)
    first, last = node_of(model, region.nodes[0]), node_of(model, end)
    out_decl = model.tensor(end)
    out_e = dtype_bytes(model, end)
    free = tuple(v for v in first.lhs if v not in c.batch)  # (m, n) after any batch indices
    return (target.tma and last.scatter is None and free[:1] == (c.m,) and first.lhs[-1] == c.n
            and len(last.lhs) == 2 + len(c.batch)
            and len(out_decl.extents) == 2 + len(c.batch) and out_e in (2, 4)
            and (sizes[out_decl.extents[-1]] * out_e) % 16 == 0)


def fit_stages(model: Model, kernel: ContractionKernel, target: Target, least: int = 2) -> ContractionKernel:
    """`kernel` with its pipeline shortened until its shared memory fits the target (with TMA stores
    where they fit at `least` stages; direct stores otherwise)."""
    c = kernel_contraction(node_of(model, kernel.nodes[0]), kernel)
    assert c is not None
    a_dt, b_dt = dtype_of(model, c.a.load.tensor), dtype_of(model, c.b.load.tensor)
    b_kmajor = c.b.k_pos == len(c.b.load.indices) - 1
    a_kmajor = c.a.k_pos == len(c.a.load.indices) - 1
    if kernel.store == "tma" and not tma_store_fits(model, replace(kernel, stages=least), target):
        kernel = replace(kernel, store="direct")
    while kernel.stages > least and contraction_smem(kernel, a_dt, b_dt, b_kmajor, a_kmajor).total > target.smem_per_block:
        kernel = replace(kernel, stages=kernel.stages - 1)
    return kernel


def tma_store_fits(model: Model, k: ContractionKernel, target: Target) -> bool:
    """Whether a schedule leaves TMA stores possible: a path that emits them, no split-K, whole boxes
    along n, and the two epilogue buffers per consumer within shared memory."""
    c = kernel_contraction(node_of(model, k.nodes[0]), k)
    assert c is not None
    out_e = dtype_bytes(model, chain_end(model, k.nodes))
    layout = contraction_smem(replace(k, store="tma"), dtype_of(model, c.a.load.tensor), dtype_of(model, c.b.load.tensor))
    support = support_for(k)
    return (isinstance(support, ContractionSupport) and support.emits_tma_stores and k.split_k == 1
            and k.tile_n % (128 // out_e) == 0 and layout.total <= target.smem_per_block)


def reads_early(model: Model, kernel: ContractionKernel) -> bool:
    """Whether the kernel's epilogue reads a model input it loads at each tile's start (`epilogue_early`;
    habu/lower/epilogue_early.py)."""
    from habu.lower import lower

    try:
        return bool(lower(model, kernel).early_loads)  # type: ignore[attr-defined]
    except ValueError:
        return False


def skips_zero(model: Model, kernel: ContractionKernel) -> bool:
    """Whether the model makes some of the kernel's k tiles zero for some output tiles, so that its default skips
    them (`skip_zero`: habu/lower/k_bounds.py), under the kernel's schedule."""
    from habu.lower import lower

    try:
        return bool(lower(model, replace(kernel, skip_zero=True)).window)  # type: ignore[attr-defined]
    except ValueError:
        return False
