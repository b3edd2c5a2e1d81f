"""The SIMT contraction path (`mma = fma`): f32 FMAs over a tile staged through shared memory."""

from __future__ import annotations

from habu.emit_cuda.emit_fma import emit_fma
from habu.emit_cuda.kernel import CudaKernel
from habu.lower.contraction import ContractionLowering
from habu.lower.support import FMA
from habu.paths.contraction import ContractionFacts, ContractionPath, OperandFacts, Shape
from habu.spec.ir import Model
from habu.target import Target
from habu.targets import Ceilings


class FmaPath(ContractionPath):
    support = FMA
    preference = 10  # every contraction has it: asked last

    def takes(self, facts: ContractionFacts, target: Target) -> bool:
        return True

    def default_movement(self, op: OperandFacts, vector: int, facts: ContractionFacts, target: Target
                         ) -> tuple[str, int]:
        if op.k_gathered:  # a pass gathers its rows into a buffer along k, read an element at a time
            return "staged", 1
        return "ldg", 1

    def offered(self, target: Target, tensor_cores: bool) -> bool:
        return True

    def default_schedule(self, m: int, n: int, target: Target, k: int = 0) -> tuple[tuple[int, int, int], int, int]:
        return (64, 64, 16), 4, 1

    def shapes(self) -> list[Shape]:
        return [(bm, bn, bk, w, 1) for bm in (32, 64, 128) for bn in (32, 64, 128) for bk in (8, 16, 32)
                for w in (4, 8)]

    def movements(self, moves: list[str]) -> list[tuple[str, str]]:
        return [(a, b) for a in ("ldg", "staged") for b in ("ldg", "staged")]  # (staged: read by ldg)

    def vector(self, move: str, vector: int) -> int:
        return vector if move != "ldg" else 1

    def peak_flops(self, c: Ceilings) -> float:
        return c.fma_flops

    def emit(self, name: str, model: Model, lowering: ContractionLowering, static: dict[str, int],  # type: ignore[override]
             target: Target, early_main_loop: bool = False) -> CudaKernel:
        return emit_fma(name, model, lowering, static)


PATH = FmaPath()
