"""The mma.sync contraction path (`mma = mma.sync`): m16n8k16 tensor-core MMAs over a warp grid,
operands staged by cp.async or ldg (A by gather4 on sm_100a)."""

from __future__ import annotations

from habu.emit_cuda.emit_mma import emit_mma
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.contraction import ContractionLowering
from habu.lower.staging import STAGED_VECTOR_BYTES
from habu.lower.support import MMA_SYNC
from habu.paths.contraction import SKINNY_ROWS, ContractionFacts, ContractionPath, OperandFacts, Shape
from habu.spec.ir import Model
from habu.target import Target
from habu.targets import Ceilings

SKINNY_IN_FLIGHT_BYTES = 32768
SHORT_K = 1024  # the longest K whose small products the default tiles 64 × 64 (`MmaSyncPath.default_schedule`)
# multiply-adds (m·n·k·batches) from which the default stages rows along k that no 4-byte vector divides: the two
# passes' launches and copies (a few µs) against 2-byte loads'. H100, session 71 (docs/experiments/stage_threshold.py,
# both plans on mma.sync, same tile): staged faster at every square size measured, 64² × 511 (≈ 2^21: 13.2 µs
# against 42.5) to 2048² × 511 (37.5 against 111.1), and 4096² × 511 (113.4 against 333.4, session 70); below
# 2^20, unmeasured, a product keeps its one launch
STAGE_MIN_PRODUCTS = 1 << 20
# a skinny product (at most SKINNY_ROWS rows) whose other operand holds this many elements streams a weight: staging
# copies it every call (three times its bytes moved, against once read in place); unmeasured, it stays in place
STAGE_MAX_STREAMED = 1 << 20
# narrow tiles for skinny (decode) contractions: 32 or 64 rows, 32 or 64 columns, deeper rings
SKINNY_SHAPES: list[Shape] = [(bm, bn, 64, 4, st) for bm in (32, 64) for bn in (32, 64) for st in (4, 6, 8)
                              if (bm, bn) != (64, 64)] + [(64, 64, 64, 4, 8)]


class MmaSyncPath(ContractionPath):
    support = MMA_SYNC
    ldg_feed = 3.0  # a scalar-load producer cannot keep tensor cores busy
    preference = 20

    def takes(self, facts: ContractionFacts, target: Target) -> bool:
        # its ldmatrix reads A contiguous along k, or along m with .trans (an A stored [k m], staged as
        # stored: habu/lower/layouts.py), or an A whose innermost index is a batch axis, copied an element at a
        # time (`A[m k s]`, s batched); an A gathered along its contiguous axis goes to the SIMT path
        a = facts.c.a.load.indices
        return facts.tensor_cores and target.mma_sync and (facts.a_kmajor or a[-1] == facts.c.m or a[-1] in facts.c.batch)

    def default_movement(self, op: OperandFacts, vector: int, facts: ContractionFacts, target: Target
                         ) -> tuple[str, int]:
        staged = "staged", STAGED_VECTOR_BYTES // op.elem_bytes  # read in 16-byte cp.async vectors (zero padding)
        if op.k_gathered or (op.batch_innermost and facts.stageable(op.rows, target)):  # a pass gathers (or
            return staged  # transposes) its rows into aligned rows along k
        if target.cp_async and vector * op.elem_bytes >= 4:
            return "cp.async", vector
        streamed = facts.m <= SKINNY_ROWS and facts.n * facts.k >= STAGE_MAX_STREAMED
        if (target.cp_async and op.contiguous_k and facts.stageable(op.rows, target) and not streamed
                and facts.m * facts.n * facts.k * facts.batches >= STAGE_MIN_PRODUCTS):
            # rows along k that no 4-byte vector divides (Triton #10927's K = 511 on sm_80): staged (gathered) to
            # aligned rows, then 16-byte cp.async, rather than a 2-byte load per element (`STAGE_MIN_PRODUCTS`)
            return staged
        return "ldg", vector

    def offered(self, target: Target, tensor_cores: bool) -> bool:
        return tensor_cores and target.mma_sync

    def vector(self, move: str, vector: int) -> int:
        # a staged buffer (16-byte rows, zeros past #K) is read in 16-byte cp.async vectors of its 2-byte elements
        return STAGED_VECTOR_BYTES // 2 if move == "staged" else vector

    def default_schedule(self, m: int, n: int, target: Target, k: int = 0) -> tuple[tuple[int, int, int], int, int]:
        # a short product (K ≤ 1024: 32 k tiles, too few to split far) whose 128 × 128 tiles fill under half the
        # SMs takes 64 × 64 tiles, 4 times the blocks (H100, session 73, docs/experiments/mma_sync_tiles.py, × 511:
        # 256² 15.6 µs against 20.4, 512² 17.7 against 22.3, 1024² 20.1 against 30.9; at 2048² 53.9 against
        # 37.7. At × 4096 the wide tile split 8 ways stayed ahead at 512², 27.7 against 40.6)
        wide = (128, 128, 32)
        if 0 < k <= SHORT_K and -(-m // wide[0]) * -(-n // wide[1]) < target.sm_count // 2:
            return (64, 64, 32), 4, 4
        return wide, 8, 3

    def skinny_tile_ms(self, m: int) -> tuple[int, ...]:
        return (32,) if m <= 32 else (64,)  # 4 warps as 2 x 2: 16 rows each (m16n8k16)

    def skinny_widths(self, facts: ContractionFacts) -> tuple[int, ...]:
        return (128, 64, 32)

    def skinny_warps_stages(self, tile_m: int, tile_n: int, tile_k: int, b_bytes: int) -> tuple[int, int]:
        # several blocks share an SM (no launch bound of one): 32 KB of B in flight per block
        return 4, max(3, min(8, -(-SKINNY_IN_FLIGHT_BYTES // (tile_n * tile_k * b_bytes))))

    def shapes(self) -> list[Shape]:
        return [(bm, bn, bk, w, st) for bm in (64, 128, 256) for bn in (64, 128, 256) for bk in (32, 64)
                for w in (4, 8) for st in (2, 3, 4, 5)]

    def skinny_shapes(self) -> list[Shape]:
        return SKINNY_SHAPES

    def movements(self, moves: list[str]) -> list[tuple[str, str]]:
        # (staged: a pass copies the rows, gathered, into aligned rows the main loop reads by cp.async or ldg)
        return [(a, b) for a in ("ldg", "cp.async", "staged") for b in ("ldg", "cp.async", "staged")]

    def peak_flops(self, c: Ceilings) -> float:
        return c.mma_sync_flops

    def emit(self, name: str, model: Model, lowering: ContractionLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        return emit_mma(name, model, lowering, static)


PATH = MmaSyncPath()
