"""sm_100a: Blackwell (B200). Compile-only here: tcgen05 is not emitted, and no B200 has timed a
plan; the mma.sync path, TMA and TMA gather4 are.

Limits: CUDA C++ Programming Guide, compute capability 10.0.
"""

from __future__ import annotations

from habu.targets.description import SETMAXNREG_RULES, TMA_RULES, Ceilings, Target

TARGET = Target(
    name="sm_100a",
    compute_capability=(10, 0),
    nvrtc_arch="sm_100a",
    description="Blackwell (B200); compile-only here (tcgen05 is not emitted)",
    smem_per_block=227 * 1024,
    smem_per_sm=228 * 1024,
    regs_per_thread=255,
    regs_per_sm=65536,
    max_threads_per_block=1024,
    sm_count=148,  # B200
    device_memory=192 * 10**9,  # B200 datasheet: 192 GB HBM3e (the largest SKU)
    l2_bytes=126 * 2**20,  # B200 datasheet: 126 MB (not measured)
    cp_async=True,
    mma_sync=True,
    tma=True,
    wgmma=False,
    tma_gather4=True,
    setmaxnreg=True,
    clusters=True,
    programmatic_launch=True,
    rules=TMA_RULES + SETMAXNREG_RULES,
    # not measured by this project (no B200 here): rough figures from the B200 datasheet (8 TB/s
    # HBM3e, about 80 TFLOP/s f32); mma.sync is a guess above the H200's. No wgmma on sm_100a
    ceilings=Ceilings(
        wgmma_flops=0.0,
        wgmma_peak=0.0,
        mma_sync_flops=600e12,
        fma_flops=75e12,
        bandwidth=7e12,
        launch_s=4e-6,  # the H200's figure (sm_90a.py), not measured on a B200
        cp_async_bandwidth=5.5e12,  # the H200's figure (sm_90a.py), not measured on a B200
    ),
)
