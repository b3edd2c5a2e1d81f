"""The wgmma contraction path (`mma = wgmma`, sm_90a): a producer warpgroup fills a ring of
TMA/cp.async stages, consumer warpgroups of 64-row slabs issue wgmma; TMA stores and clusters of 2
with B multicast."""

from __future__ import annotations

from habu.emit_cuda.emit_wgmma import emit_wgmma
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.contraction import ContractionLowering
from habu.lower.pipeline import lag_refusal
from habu.lower.support import WGMMA
from habu.paths.contraction import (
    LAG_TILES,
    SKINNY_FILL,
    SKINNY_MIN_K_TILES,
    ContractionFacts,
    ContractionPath,
    OperandFacts,
    Schedule,
    Shape,
    batch_innermost,
)
from habu.plan.plan import CLUSTERS, STORES, ContractionKernel
from habu.spec.ir import Model
from habu.target import Target
from habu.targets import Ceilings

# operand bytes in flight per SM that keep wgmma fed (fitted to 1715 GGEMM plans timed on the H200:
# with the refill term, the rank correlation of predicted and measured times went from 0.40 to 0.82;
# on 1135 MoE plans from another search, 0.47 to 0.61)
IN_FLIGHT_BYTES = 131072
SKINNY_STAGES = 16  # the deepest ring a skinny default asks for (64x16 tiles: 2 KB of B a stage)
# narrow and deep 64-row tiles for skinny (decode) contractions: the weights streamed by enough blocks
# with enough bytes in flight each (the wide shapes above stop at 6 stages of 64-wide tiles)
SKINNY_SHAPES: list[Shape] = [(64, bn, 64, 8, st) for bn in (16, 32, 48) for st in (4, 6, 8, 12)] + \
    [(64, bn, 64, 8, st) for bn in (64, 128) for st in (8, 10, 12)] + \
    [(64, bn, bk, 8, st) for bn, bk, st in ((64, 128, 4), (64, 128, 6), (128, 128, 4), (64, 256, 3), (128, 256, 2))]
# (the last: k tiles of 2 and 4 swizzle spans, 256 and 512 bytes of each K-major weight row a stage)

# A skinny product of at most SWAP_ROWS rows (decode: a few tokens through a layer's weights) is computed
# transposed by default (`swap_ab`): the weights fill wgmma's 64-row side and the tokens its n side (16 or 32
# columns), so no stage holds rows of padding (a 64-row tile of 16 tokens is three quarters padding: the
# ring's bytes and the tensor cores' work) and the ring holds more of the weights in flight. cuBLAS takes the
# same form (H200, 2026-12-04: `x @ W1` at 16 x 4096 x 14336 ran nvjet 128x16 tiles, 11 stages, 29.5 µs, 3.98
# TB/s, against Habu's 64x128 tiles' 37.7 µs).
SWAP_ROWS = 32
SWAP_STAGES = 16  # asked for; `fit_stages` shortens the ring to what shared memory holds
# the transposed shapes the search tries: 64 or 128 weight rows by 16-64 tokens, rings of 6-16 stages
SWAP_SHAPES: list[Shape] = [(bm, bn, 64, 8 if bm == 64 else 12, st) for bm in (64, 128) for bn in (16, 32, 64)
                            for st in (6, 8, 12, 16, 22)]


def wgmma_warps_stages(tile_m: int, tile_n: int) -> tuple[int, int]:
    """The default warps and pipeline depth of a wgmma tile: a producer warpgroup and consumer
    warpgroups of one or two 64-row slabs; as many 64-deep stages as fit beside the epilogue."""
    warps = 8 if tile_m == 64 else 12 if tile_m in (128, 256) else 4 * (1 + tile_m // 64)
    area = tile_m * tile_n
    stages = 6 if area <= 128 * 64 else 5 if area <= 128 * 128 else 4 if area <= 128 * 256 else 3
    return warps, stages


class WgmmaPath(ContractionPath):
    support = WGMMA
    ldg_feed = 3.0  # a scalar-load producer cannot keep tensor cores busy
    preference = 30  # asked first: where it takes a contraction, it is the fastest
    swizzled = True

    def takes(self, facts: ContractionFacts, target: Target) -> bool:
        # (an operand whose innermost index is a batch axis, `A[m k s]`, is staged k-major: `default_movement`)
        a, b = (target.tma and batch_innermost(facts.c, op) and facts.stageable(rows, target)
                for op, rows in ((facts.c.a, facts.m), (facts.c.b, facts.n)))
        return (facts.tensor_cores and target.wgmma and (facts.a_kmajor or facts.a_m_major_tma or a)
                and (facts.b_kmajor or facts.b_n_major_tma or b) and facts.k >= 64)

    def default_movement(self, op: OperandFacts, vector: int, facts: ContractionFacts, target: Target
                         ) -> tuple[str, int]:
        if op.k_gathered or op.batch_innermost:  # a pass gathers (or transposes) its rows into a k-major buffer
            return "staged", vector  # that TMA reads (a batched one's keeps the batch axes outermost)
        if not op.gathered and target.tma and op.aligned_rows and op.contiguous_k:
            return "tma", vector
        if (op.is_b and facts.b_n_major_tma) or (not op.is_b and facts.a_m_major_tma):
            return "tma", vector  # read MN-major in 64-column boxes, with wgmma's transpose bit
        if target.tma and op.contiguous_k and not op.aligned_rows and facts.stageable(op.rows, target):
            # rows not 16-byte aligned (Triton #10927's K = 511): stage them to aligned rows, then TMA
            return "staged", vector
        if target.cp_async and vector * op.elem_bytes >= 4 and op.contiguous_k:
            return "cp.async", vector
        return "ldg", vector

    def default_warp_specialized(self, target: Target) -> bool:
        return target.setmaxnreg

    def default_persistent(self, k_tiles: int, tiles: int, split: int, target: Target,
                           moves: tuple[str, str] = ("tma", "tma")) -> bool:
        """Short k loops over many tiles: the epilogue (stores of a whole tile) is most of a tile's time,
        and a persistent block hides it behind the next tile's TMA loads. H200, 2026-12-01, batched
        scores 32×2048×2048×128 bf16 (2 k tiles, 4096 tiles of 128×256): 94.7 µs persistent against
        144.9 µs one block a tile (torch.bmm 89.7 µs); P·V (32 k tiles) 122 against 127 µs at 128×256.
        Long k loops over many waves of tiles with both operands by TMA too: the FFN's 4096 × 14336 × 4096
        product (64 k tiles, 1792 tiles) 608.2 µs persistent against 621.0 (H200, 2026-12-02; torch 602.3);
        a gathered or staged operand keeps one block a tile (GGEMM 4096³ staged and persistent 0.77× torch)."""
        if split != 1 or tiles < 4 * target.sm_count:
            return False
        return k_tiles <= 4 or moves == ("tma", "tma")

    def tile_schedule(self, tile_m: int, tile_n: int) -> tuple[int, int] | None:
        return wgmma_warps_stages(tile_m, tile_n)

    def offered(self, target: Target, tensor_cores: bool) -> bool:
        return tensor_cores and target.wgmma

    def reads_boxes(self, move: str) -> bool:
        return move in ("tma", "tma_gather4", "staged")  # a staged buffer is read by TMA

    def default_schedule(self, m: int, n: int, target: Target, k: int = 0) -> tuple[tuple[int, int, int], int, int]:
        wide = 256 if n >= 2048 and m >= 1024 else 128
        tile, warps, stages = (128, wide, 64), 12, 4 if wide == 256 else 5
        # a skinny problem (128 tokens through a 4096-wide layer) leaves most SMs idle with 128-wide
        # tiles: narrow them, then shorten them, until the tiles cover half the SMs (H200, 2026-12-01,
        # FFN-SKIP's second GEMM 128x4096x14336: 32 tiles of 128x128; the search's winner took 64x64)
        while -(-m // tile[0]) * -(-n // tile[1]) < target.sm_count // 2 and max(tile[:2]) > 64:
            tile = (tile[0], tile[1] // 2, 64) if tile[1] > 64 else (64, tile[1], 64)
            warps, stages = wgmma_warps_stages(tile[0], tile[1])
        return tile, warps, stages

    def skinny_tile_ms(self, m: int) -> tuple[int, ...]:
        # past 64 tokens, 128-row tiles where they fill a wave (two consumer warpgroups share each B
        # tile: the weights cross L2 once), else 64-row ones, twice the blocks (FFN-SKIP at 128 tokens:
        # the search's winner for the second GEMM, 128x4096 K 14336, was 64x64, H200 2026-12-01)
        return (128, 64) if m > 64 else (64,)

    def skinny_widths(self, facts: ContractionFacts) -> tuple[int, ...]:
        # a B contiguous along n is read by TMA in 64-column boxes (`WgmmaSupport`); along k, any
        # multiple of 16 is an m64nNk16 instruction. A B contiguous along n at most 64 tokens keeps
        # 128-wide tiles even short of a wave: H200, 2026-12-01 (habu.bench.decode_speed), FFN-SKIP's
        # down projection at 16 tokens 86.3 µs with 64x128 s8 against 96.2 µs with 64x64 s13 (the whole
        # layer), RMSNorm+Linear at 16 tokens 17.6 µs against 19.2 µs
        if not facts.b_kmajor:
            return (256, 128) if facts.m <= 64 else (256, 128, 64)
        return (256, 128, 64, 32, 16)

    def skinny_warps_stages(self, tile_m: int, tile_n: int, tile_k: int, b_bytes: int) -> tuple[int, int]:
        # B's bytes in flight per SM that keep the weights streaming (the IN_FLIGHT_BYTES term below):
        # as many stages as that takes, up to SKINNY_STAGES (`fit_stages` shortens to shared memory)
        warps, _ = wgmma_warps_stages(tile_m, tile_n)
        return warps, max(4, min(SKINNY_STAGES, -(-IN_FLIGHT_BYTES // (tile_n * tile_k * b_bytes))))

    def swaps(self, facts: ContractionFacts, target: Target) -> bool:
        # the tokens' operand K-major (it becomes B, read in 16-row boxes or gathered by cp.async), the weights
        # read by TMA either way round (K-major, or MN-major in 64-column boxes with wgmma's transpose bit)
        return (facts.m <= SWAP_ROWS and facts.n >= 1024 and facts.a_kmajor
                and (facts.b_kmajor or facts.b_n_major_tma))

    def swapped_schedule(self, facts: ContractionFacts, target: Target) -> tuple[tuple[Schedule, int], str]:
        # 128 weight rows a tile where those tiles fill a wave (two consumer warpgroups share the tokens' tile),
        # else 64, split in two by a cluster where that doubles the blocks within one wave
        tile_n = 16 if facts.n <= 16 else 32
        tile_m = 128 if -(-facts.m // 128) >= SKINNY_FILL * target.sm_count else 64
        tiles, k_tiles = -(-facts.m // tile_m), -(-facts.k // self.skinny_tile_k)
        split, reduce = 1, "atomic"
        if (tiles < SKINNY_FILL * target.sm_count and tiles * 2 <= target.sm_count and self.cluster_splits(target)
                and k_tiles >= 2 * SKINNY_MIN_K_TILES):
            split, reduce = 2, "cluster"
        warps, _ = wgmma_warps_stages(tile_m, tile_n)
        return (((tile_m, tile_n, self.skinny_tile_k), warps, SWAP_STAGES), split), reduce

    def swapped_shapes(self) -> list[Shape]:
        return SWAP_SHAPES

    def shapes(self) -> list[Shape]:
        # (112: a 14336-wide product in 128 tiles, not 112, where B is k-major; cuBLAS takes 112-wide tiles for
        # FFN-SKIP's dT3 = dT6·W2ᵀ at 128 tokens, H200 2026-12-05: 32.2 µs in torch.compile's step)
        return [(bm, bn, 64, 4 * (1 + bm // (64 * slabs)), st) for bm in (64, 128, 256)
                for bn in (64, 96, 112, 128, 192, 256) for slabs in (1, 2) if bm % (64 * slabs) == 0
                for st in (2, 3, 4, 5, 6)]

    def skinny_shapes(self) -> list[Shape]:
        return SKINNY_SHAPES

    def movements(self, moves: list[str]) -> list[tuple[str, str]]:
        return [(a, b) for a in [*moves, "staged"] if a != "tma-gather4"
                for b in [*moves, "staged"] if b != "tma-gather4"]

    def stores(self, target: Target) -> tuple[str, ...]:
        return STORES if target.tma else ("direct",)

    def clusters(self, target: Target) -> tuple[int, ...]:
        return CLUSTERS if target.clusters and target.tma else (1,)

    def cluster_splits(self, target: Target) -> bool:
        return target.clusters

    def b_ahead_offered(self, kernel: ContractionKernel) -> bool:
        return kernel.b_move == "tma" and kernel.cluster_m == 1

    def lag_offered(self, kernel: ContractionKernel) -> bool:
        return lag_refusal(kernel, LAG_TILES) is None

    def fixed_fields(self, target: Target) -> dict[str, object]:
        return {"warp_specialized": target.setmaxnreg, "swizzle": 128}

    def peak_flops(self, c: Ceilings) -> float:
        return c.wgmma_flops

    def stage_efficiency(self, kernel: ContractionKernel, a_bytes: int, b_bytes: int) -> float:
        # wgmma needs about 128 KB of operand tiles in flight per SM (H200, GGEMM 4096³, 2026-12-01:
        # 128x128 tiles 209 µs with 6 stages (192 KB), 220 with 4, 268 with 3; 128x256 184 with 4
        # stages, 278 with 2)
        in_flight = kernel.stages * (kernel.tile_m * a_bytes + kernel.tile_n * b_bytes) * kernel.tile_k
        return min(1.0, in_flight / IN_FLIGHT_BYTES)

    def emit(self, name: str, model: Model, lowering: ContractionLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        return emit_wgmma(name, model, lowering, static, early_main_loop)


PATH = WgmmaPath()
