"""What a GPU target file describes: `Target` (limits, instructions, rule families, performance
ceilings, NVRTC arch) and `Ceilings` (the cost model's and roofline's figures). One instance per
file in this package (`habu/targets/sm_90a.py`, ...); `habu.targets` registers them.

This module sits at the bottom of the layers: it imports nothing of Habu. The rules a target checks
are therefore named here by string; `habu/prove/rules.py` looks the names up in its table.
"""

from __future__ import annotations

from dataclasses import dataclass

# rule families a target may check on top of the common ones (`COMMON` in habu/prove/rules.py,
# which every target checks): the names of rules in that file's table
TMA_RULES: tuple[str, ...] = ("tma-rank", "tma-base-align", "tma-dims", "tma-stride-16B", "tma-box", "tma-swizzle",
                              "tma-smem-align", "tma-gather")
SETMAXNREG_RULES: tuple[str, ...] = ("setmaxnreg-pool",)  # warp-specialised register splits


@dataclass(frozen=True, kw_only=True)
class Ceilings:
    """The peak rates the cost model (`habu/search/cost.py`) orders plans with and the roofline
    bounds them by. Each target file says where each figure comes from (measured, or a datasheet)."""

    wgmma_flops: float  # FLOP/s real wgmma kernels reach (0: no wgmma)
    wgmma_peak: float  # the roofline's compute bound: wgmma alone, no memory traffic (0: no wgmma)
    mma_sync_flops: float
    fma_flops: float
    bandwidth: float  # bytes/s, device memory, read + write
    launch_s: float  # per kernel, prepared launches
    cp_async_bandwidth: float  # bytes/s, L2 to shared memory by cp.async, all SMs


@dataclass(frozen=True, kw_only=True)
class Target:
    """One GPU target: everything Habu's rules, search, cost model and compiler need to know of it."""

    name: str  # what --target says, what plans and the plan database record, e.g. "sm_90a"
    compute_capability: tuple[int, int]  # the devices it runs on (`target_for_capability`)
    nvrtc_arch: str  # --gpu-architecture for NVRTC/nvcc
    description: str
    # limits
    smem_per_block: int  # bytes of shared memory one block may opt in to
    smem_per_sm: int
    regs_per_thread: int
    regs_per_sm: int
    max_threads_per_block: int
    sm_count: int  # of the reference part; the runtime reads the real count
    # instructions and hardware features
    cp_async: bool  # cp.async (sm_80+)
    mma_sync: bool  # mma.sync m16n8k16 with bf16/f16 (sm_80+)
    tma: bool  # cp.async.bulk.tensor (sm_90+)
    wgmma: bool  # wgmma.mma_async (sm_90a only)
    tma_gather4: bool  # cp.async.bulk.tensor.2d.tile::gather4 (sm_100+)
    setmaxnreg: bool  # setmaxnreg: warp-specialised kernels move registers to their consumers (sm_90a+)
    clusters: bool  # thread-block clusters, distributed shared memory, TMA multicast (sm_90+)
    programmatic_launch: bool  # griddepcontrol: a kernel starts while the previous one finishes (sm_90+)
    # rules checked here beyond habu/prove/rules.py's COMMON (rule names, e.g. TMA_RULES)
    rules: tuple[str, ...]
    ceilings: Ceilings
    # bytes of device memory on the largest part of this target: a tensor (or a model's tensors
    # together) larger than this can never run, and is refused before anything is proven
    device_memory: int
    l2_bytes: int  # the L2 cache (the cost model: whether a round of attention tiles' K and V stays in it)
    max_grid_x: int = 2**31 - 1  # blocks along a grid's x (CUDA guide: every compute capability since 3.0)
    max_grid_yz: int = 65535  # ... and along its y and z


__all__ = ["SETMAXNREG_RULES", "TMA_RULES", "Ceilings", "Target"]
