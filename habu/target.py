"""GPU targets: one description each of the limits and instructions a plan may use.

Adding a target is adding one `Target` here and, in `habu/prove/rules.py`, its rule table.
"""

from __future__ import annotations

from dataclasses import dataclass

from habu.errors import UsageError


@dataclass(frozen=True)
class Target:
    name: str  # the NVRTC arch, e.g. "sm_90a"
    compute_capability: tuple[int, int]
    smem_per_block: int  # bytes of shared memory one block may opt in to
    smem_per_sm: int
    regs_per_thread: int
    regs_per_sm: int
    max_threads_per_block: int
    sm_count: int  # of the reference part (H100/H200 SXM: 132); the runtime reads the real count
    cp_async: bool  # cp.async (sm_80+)
    mma_sync: bool  # mma.sync m16n8k16 with bf16/f16 (sm_80+)
    tma: bool  # cp.async.bulk.tensor (sm_90+)
    wgmma: bool  # wgmma.mma_async (sm_90a only)
    tma_gather4: bool  # cp.async.bulk.tensor.2d.tile::gather4 (sm_100+)
    description: str = ""
    max_grid_x: int = 2**31 - 1  # blocks along a grid's x (CUDA guide: every compute capability since 3.0)
    max_grid_yz: int = 65535  # ... and along its y and z


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("sm_80", (8, 0), 163 * 1024, 164 * 1024, 255, 65536, 1024, 108,
               cp_async=True, mma_sync=True, tma=False, wgmma=False, tma_gather4=False,
               description="Ampere (A100)"),
        Target("sm_90a", (9, 0), 227 * 1024, 228 * 1024, 255, 65536, 1024, 132,
               cp_async=True, mma_sync=True, tma=True, wgmma=True, tma_gather4=False,
               description="Hopper (H100, H200) with the arch-specific wgmma/setmaxnreg features"),
        Target("sm_100a", (10, 0), 227 * 1024, 228 * 1024, 255, 65536, 1024, 148,
               cp_async=True, mma_sync=True, tma=True, wgmma=False, tma_gather4=True,
               description="Blackwell (B200); compile-only here (tcgen05 is not emitted)"),
    )
}

DEFAULT_TARGET = "sm_90a"


def target_for_capability(major: int, minor: int) -> str:
    """The target name a device of this compute capability is built for (sm_MAJOR MINOR when Habu has
    no description of it, which `target_named` then refuses)."""
    for t in TARGETS.values():
        if t.compute_capability == (major, minor):
            return t.name
    return f"sm_{major}{minor}"


def target_named(name: str) -> Target:
    t = TARGETS.get(name) or TARGETS.get(name.lower())
    if t is None:
        raise UsageError(f"unknown target {name!r} (targets: {', '.join(TARGETS)})")
    return t
