"""Planted bugs in the wgmma TMA-store epilogue's own loads (habu/emit_cuda/emit_epilogue_pairs.py
`pair_operands`: each load declared once per element, its offset and mask printed from the lowering's
`Access`). The finite-field check reads the same accesses, so each must be killed (habu.bench.mutants lists
them)."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import ContractionLowering, Lowering
from habu.lower.access import Bound

SWAP = {"m": "n", "n": "m"}


def epilogue_operand_transposed(lw: Lowering) -> Lowering:
    """GEMM-ACC's C, read in the epilogue (C += A·Bᵀ), at [n, m] with m's stride: a load inside the buffer
    (M = 256 > N = 128), the wrong element."""
    assert isinstance(lw, ContractionLowering)
    loads = tuple((ld, replace(acc, positions=tuple(replace(p, axis=SWAP.get(p.axis, p.axis)) for p in acc.positions),
                               masks=tuple(Bound(SWAP[b.axis], lw.n if b.axis == "m" else lw.m)
                                           if b.axis in SWAP else b for b in acc.masks)))
                  for ld, acc in lw.epi_loads)
    return replace(lw, epi_loads=loads)


MUTANT_ENTRIES = (
    ("tma-store-epilogue-operand-transposed", "the wgmma TMA-store epilogue reads GEMM-ACC's C at [n, m] "
     "(the operand it declares once per element)", "accumulate.habu", "GEMM-ACC", {}, epilogue_operand_transposed),
)

__all__ = ["MUTANT_ENTRIES", "epilogue_operand_transposed"]
