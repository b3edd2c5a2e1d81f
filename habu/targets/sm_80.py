"""sm_80: Ampere, the A100. Also the pattern for a new target: copy this file, change what differs,
and add its name to `BUILT_IN_FILES` in `habu/targets/__init__.py` (docs/ARCHITECTURE.md, "Adding a target").

Limits: CUDA C++ Programming Guide, compute capability 8.0. Not for 8.6/8.9 parts (RTX 30xx/40xx,
A10, L4, L40): their blocks get 99 KB of shared memory, not 163 KB (see `habu/targets/__init__.py`).
"""

from __future__ import annotations

from habu.targets.description import Ceilings, Target

TARGET = Target(
    name="sm_80",
    compute_capability=(8, 0),
    nvrtc_arch="sm_80",
    description="Ampere (A100)",
    smem_per_block=163 * 1024,
    smem_per_sm=164 * 1024,
    regs_per_thread=255,
    regs_per_sm=65536,
    max_threads_per_block=1024,
    sm_count=108,  # A100 SXM/PCIe
    device_memory=80 * 2**30,  # A100 80GB (nvidia-smi: 81920 MiB); the 40GB part holds half
    l2_bytes=40 * 2**20,  # A100: 40 MiB (datasheet)
    cp_async=True,
    mma_sync=True,
    tma=False,
    wgmma=False,
    tma_gather4=False,
    setmaxnreg=False,
    clusters=False,
    programmatic_launch=False,
    rules=(),  # the common rules alone: no TMA, no setmaxnreg
    # not measured by this project (no A100 here): the A100 datasheet's 312 TFLOP/s dense bf16,
    # 19.5 TFLOP/s f32 and 1.6-2.0 TB/s HBM2e, rounded down to what kernels sustain
    ceilings=Ceilings(
        wgmma_flops=0.0,
        wgmma_peak=0.0,
        mma_sync_flops=280e12,
        fma_flops=19e12,
        bandwidth=1.8e12,
        launch_s=4e-6,  # the H200's figure (sm_90a.py), not measured on an A100
        cp_async_bandwidth=5.5e12,  # the H200's figure (sm_90a.py), not measured on an A100
    ),
)
