"""The rule of a contraction whose blocks share an SM (`ContractionKernel.blocks_per_sm` > 1): only the
warp-specialised wgmma path prints the bound (`__launch_bounds__(threads, n)`) and sizes its register split
for it (habu/lower/registers.py), and n blocks' shared memory, each with the driver's reserved kilobyte, must
fit the SM together. Otherwise the GPU runs fewer blocks an SM than the plan was chosen for: not wrong, but
not the plan that was proven and timed."""

from __future__ import annotations

from collections.abc import Iterator

from habu.lower.registers import RegisterSplit
from habu.plan.plan import ContractionKernel
from habu.prove.obligation import Obligation, Rule
from habu.target import Target

# the shared memory the driver reserves for each resident block (CUDA guide: "1 KB of shared memory is
# reserved for system use" per block on sm_80 and later)
RESERVED_SMEM_PER_BLOCK = 1024

OCCUPANCY_RULES = {r.name: r for r in (
    Rule("co-resident-blocks", "blocks asked to share an SM fit it together: the warp-specialised wgmma path "
         "(launch bounds and register split for n blocks), n × (shared memory + the reserved 1 KB) within the SM",
         "CUDA guide: occupancy, __launch_bounds__ minBlocksPerMultiprocessor; 1 KB reserved a block"),
)}


def occupancy_obligations(name: str, k: ContractionKernel, split: RegisterSplit | None, smem: int,
                          target: Target) -> Iterator[Obligation]:
    """Nothing for one block an SM; else the path prints the bound and the blocks' shared memory fits."""
    n = k.blocks_per_sm
    if n <= 1:
        return
    rule = OCCUPANCY_RULES["co-resident-blocks"]
    yield Obligation(rule, name, None, f"{n} blocks an SM: a warp-specialised wgmma kernel",
                     split is not None and k.mma == "wgmma",
                     detail=f"only the warp-specialised wgmma path bounds its launch for {n} blocks an SM "
                            f"(this plan: mma {k.mma}, warp_specialized {k.warp_specialized})")
    need = n * (smem + RESERVED_SMEM_PER_BLOCK)
    yield Obligation(rule, name, None, f"{n} × ({smem} + {RESERVED_SMEM_PER_BLOCK}) bytes of shared memory ≤ "
                     f"{target.smem_per_sm} a SM", need <= target.smem_per_sm,
                     detail=f"{n} blocks need {need} bytes of shared memory; an SM of {target.name} has "
                            f"{target.smem_per_sm}")


__all__ = ["OCCUPANCY_RULES", "RESERVED_SMEM_PER_BLOCK", "occupancy_obligations"]
