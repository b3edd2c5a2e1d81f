"""sm_90a: Hopper (H100, H200) with the arch-specific features (wgmma, setmaxnreg).

Limits: CUDA C++ Programming Guide, compute capability 9.0. The SM count and the ceilings are the
H200 SXM's, where this project's measurements run.
"""

from __future__ import annotations

from habu.targets.description import SETMAXNREG_RULES, TMA_RULES, Ceilings, Target

TARGET = Target(
    name="sm_90a",
    compute_capability=(9, 0),
    nvrtc_arch="sm_90a",
    description="Hopper (H100, H200) with the arch-specific wgmma/setmaxnreg features",
    smem_per_block=227 * 1024,
    smem_per_sm=228 * 1024,
    regs_per_thread=255,
    regs_per_sm=65536,
    max_threads_per_block=1024,
    sm_count=132,  # H100/H200 SXM
    device_memory=143771 * 2**20,  # H200 (nvidia-smi: 143771 MiB); the H100 holds 80 GiB
    l2_bytes=60 * 2**20,  # H200: 60 MiB (torch: L2_cache_size 62914560, 2026-12-03); the H100 has 50
    cp_async=True,
    mma_sync=True,
    tma=True,
    wgmma=True,
    tma_gather4=False,
    setmaxnreg=True,
    clusters=True,
    programmatic_launch=True,
    rules=TMA_RULES + SETMAXNREG_RULES,
    ceilings=Ceilings(
        # H200, 2026-11-30, this project's runs: bf16 wgmma as real kernels reach it (cuBLAS 4096³
        # 807 TFLOP/s, Habu's own GEMM with TMA stores 803)
        wgmma_flops=810e12,
        # the tensor cores' own ceiling: wgmma alone, no memory traffic (`habu.bench.mma_ceiling` at
        # 8192³, 96% of the peak at the 1726 MHz it ran at). With 810 as the roofline, plans were
        # quoted at 94% of it while the instructions alone ran 11% faster
        wgmma_peak=898e12,
        # not timed against wgmma here: fractions of the wgmma figure from the datasheet's ratios
        mma_sync_flops=380e12,
        fma_flops=50e12,
        bandwidth=4.2e12,  # H200 device copy, 2026-11-30
        launch_s=4e-6,  # per prepared launch: the cost model's estimate since its first version
        # L2 to shared memory by cp.async, all SMs: fitted to 1715 GGEMM plans timed on the H200
        # (2026-12-01; 256x64 tiles copy 2.1 GB of A in 409 µs, 256x96 1.4 GB in 328, 256x128 1.1 GB
        # in 236); rank correlation of predicted and measured times 0.40 -> 0.79
        cp_async_bandwidth=5.5e12,
    ),
)
