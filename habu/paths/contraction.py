"""What the three contraction paths (fma, mma.sync, wgmma) share: the search space's shape of a
contraction variant, the shared-memory layout, and the cost model's terms, each path filling in its
own tables."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from habu.lower.contraction import ContractionLowering
from habu.lower.support import ContractionSupport, contraction_smem
from habu.paths.base import KernelPath
from habu.plan.plan import MOVEMENTS, RASTERS, ContractionKernel, Kernel
from habu.target import Target
from habu.targets import Ceilings

Shape = tuple[int, int, int, int, int]  # tile_m, tile_n, tile_k, warps, stages


def target_moves(target: Target) -> list[str]:
    """The operand movements the target has."""
    return [m for m in MOVEMENTS if m == "ldg" or (m == "cp.async" and target.cp_async)
            or (m == "tma" and target.tma) or (m == "tma-gather4" and target.tma_gather4)]


class ContractionPath(KernelPath):
    """A contraction path: subclasses give the tables below; `variants` combines them."""

    support: ContractionSupport

    @property
    def mma(self) -> str:
        return self.support.mma

    # ------------------------------------------------------------------ the search space

    def offered(self, target: Target, tensor_cores: bool) -> bool:
        """Whether the search tries this path for a contraction (`tensor_cores`: bf16/f16 operands)."""
        raise NotImplementedError

    def default_schedule(self, m: int, n: int, target: Target) -> tuple[tuple[int, int, int], int, int]:
        """The analytic default's (tile, warps, stages) for an M x N output."""
        raise NotImplementedError

    def shapes(self) -> list[Shape]:
        """The (tile_m, tile_n, tile_k, warps, stages) choices its emitter supports."""
        raise NotImplementedError

    def movements(self, moves: list[str]) -> list[tuple[str, str]]:
        """(A, B) movements tried, out of the target's `moves`."""
        raise NotImplementedError

    def stores(self, target: Target) -> tuple[str, ...]:
        return ("direct",)

    def clusters(self, target: Target) -> tuple[int, ...]:
        return (1,)

    def vector(self, move: str, vector: int) -> int:
        """The vector width an operand moved by `move` gets, `vector` being the widest aligned one."""
        return vector

    def fixed_fields(self, target: Target) -> dict[str, object]:
        """Kernel fields the path fixes (warp specialisation, swizzle)."""
        return {"warp_specialized": False, "swizzle": 0}

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        import itertools

        assert isinstance(base, ContractionKernel)
        for (bm, bn, bk, warps, stages), (am, bmv), split, raster, group, persistent, store, cluster in \
                itertools.product(self.shapes(), self.movements(target_moves(target)), (1, 2, 4), RASTERS, (1, 8),
                                  (False, True), self.stores(target), self.clusters(target)):
            if cluster > 1 and (bmv != "tma" or split > 1 or not persistent):
                # a cluster multicasts B by TMA, without split-K (the rules say so of pins); the
                # search tries it on persistent plans alone: on the H200 a cluster of 2 timed the same
                # as one block (GGEMM 4096³ 182.1 vs 183.4 µs, GEMM 8192³ 1373.7 vs 1365.2, 2026-11-30)
                continue
            yield replace(base, mma=self.mma, tile_m=bm, tile_n=bn, tile_k=bk, warps=warps, stages=stages,
                          a_move=am, b_move=bmv, a_vector=self.vector(am, base.a_vector),
                          b_vector=self.vector(bmv, base.b_vector), split_k=split,
                          raster=raster, group_m=group, persistent=persistent, **self.fixed_fields(target),
                          store=store, cluster_m=cluster)

    # ------------------------------------------------------------------ resources

    def smem_bytes(self, lowering: ContractionLowering) -> int:  # type: ignore[override]
        lw = lowering
        return contraction_smem(lw.kernel, lw.a.dtype, lw.b.dtype, lw.b.positions[-1].axis == "k").total

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
