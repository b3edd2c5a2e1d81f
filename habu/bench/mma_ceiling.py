"""How fast can the tensor cores of this GPU go on a GEMM's worth of wgmma, with no memory traffic?

A persistent kernel (one block per SM, two consumer warpgroups of one 64-row slab each, like Habu's
128 x 256 wgmma plans) runs exactly the wgmma instructions a tiled M x N x K GEMM would issue: the
tiles of the grid walked `lin += gridDim.x`, per tile K/64 k steps of 4 m64n256k16 per warpgroup,
one group in flight, from shared memory filled once with random bf16 made in place (a hash). No
loads, no barriers, no epilogue: its time is a floor for any kernel of that tiling on this GPU, and its TFLOP/s a ceiling
(random operands, so the tensor cores draw the power a real GEMM's would). Block 0 reads the SM
clock and the global timer at both ends, so the probe also reports the clock the GPU ran at.

    python -m habu.bench.mma_ceiling [--m 4096 --n 4096 --k 4096] [--json out.json]

Timed in one process against torch's bf16 matmul (cuBLAS) of the same size.
"""

from __future__ import annotations

import argparse
import ctypes
import json
from pathlib import Path
from typing import Any

from habu.emit_cuda.wgmma import wgmma_function, wgmma_name

TILE_M, TILE_N, TILE_K = 128, 256, 64
STAGES = 4  # shared-memory k tiles the probe cycles through, as a 4-stage plan would
STAGE_BYTES = (TILE_M + TILE_N) * TILE_K * 2
FLOP_PER_CLOCK_PER_SM = 4096  # dense bf16 wgmma on sm_90: 1024 FMA per tensor core per 2 clocks x 4 x 2


def probe_source(name: str = "habu_mma_ceiling") -> str:
    """The probe kernel's CUDA source (Habu's header, the generated m64n256k16 wrapper)."""
    fn = wgmma_name(TILE_N, "bf16")
    return f"""#include "habu/habu.cuh"
{wgmma_function(TILE_N, "bf16")}
extern "C" __global__ void __launch_bounds__(256, 1) {name}(float* out, unsigned long long* clocks, long long tiles,
    long long k_steps, unsigned int seed) {{
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const habu::u32 raw_base = habu::smem_addr(smem_raw);
  const habu::u32 smem_base = (raw_base + 1023u) & ~1023u;
  unsigned int* words = reinterpret_cast<unsigned int*>(smem_raw + (smem_base - raw_base));
  // random bf16 pairs in (-2, 2) from a hash of the word's index: no global reads before the timing
  for (int i = threadIdx.x; i < {STAGES * STAGE_BYTES // 4}; i += blockDim.x) {{
    unsigned int h = (unsigned int)i * 0x9E3779B1u ^ seed;
    h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12; h *= 0x297A2D39u; h ^= h >> 15;
    words[i] = h & 0xBFFFBFFFu;  // clear each half's top exponent bit: magnitudes below 2, no inf/nan
  }}
  __syncthreads();
  unsigned long long c0 = 0, t0 = 0;
  if (blockIdx.x == 0 && threadIdx.x == 0) {{
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    c0 = clock64();
  }}
  const int cw = threadIdx.x / 128;
  float acc[{TILE_N // 2}];
  float keep = 0.0f;
  int stage = 0;
  for (long long lin = blockIdx.x; lin < tiles; lin += gridDim.x) {{
#pragma unroll
    for (int i = 0; i < {TILE_N // 2}; ++i) acc[i] = 0.0f;
    for (long long kt = 0; kt < k_steps; ++kt) {{
      const habu::u32 a_stage = smem_base + (habu::u32)stage * {STAGE_BYTES}u + (habu::u32)cw * {64 * 128}u;
      const habu::u32 b_stage = smem_base + (habu::u32)stage * {STAGE_BYTES}u + {TILE_M * 128}u;
      habu::wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        {fn}(acc, habu::wgmma_desc_sw128(a_stage + kk * 32), habu::wgmma_desc_sw128(b_stage + kk * 32), 1);
      habu::wgmma_commit();
      habu::wgmma_wait<1>();
      if (++stage == {STAGES}) stage = 0;
    }}
    habu::wgmma_wait<0>();
    keep += acc[0] + acc[{TILE_N // 2 - 1}];
  }}
  out[blockIdx.x * blockDim.x + threadIdx.x] = keep;  // keeps the accumulators live
  __syncthreads();
  if (blockIdx.x == 0 && threadIdx.x == 0) {{
    unsigned long long t1;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    clocks[0] = clock64() - c0;
    clocks[1] = t1 - t0;
  }}
}}
"""


def shared_bytes() -> int:
    return STAGES * STAGE_BYTES + 1024  # + the alignment slack


def tile_count(m: int, n: int) -> int:
    return -(-m // TILE_M) * -(-n // TILE_N)


def measure(m: int, n: int, k: int, reps: int = 30) -> dict[str, Any]:
    """Time the probe for an m x n x k GEMM's tiles, and torch's bf16 matmul of that size."""
    from habu.emit_cuda import driver
    from habu.emit_cuda.nvrtc import compile_cuda
    from habu.timing.harness import time_cuda, torch

    t = torch()
    t.cuda.init()
    dev = driver.device(0)
    name = "habu_mma_ceiling"
    cubin = compile_cuda(probe_source(name), name, dev.arch)
    d = driver._driver()
    with driver.current(dev):
        fn = driver.load_cubin(cubin).function(name)
        driver.allow_smem(fn, shared_bytes(), name)
    g = t.Generator(device="cuda").manual_seed(0)
    out = t.empty(dev.sm_count * 256, device="cuda", dtype=t.float32)
    clocks = t.zeros(2, device="cuda", dtype=t.int64)
    tiles = tile_count(m, n)
    k_steps = -(-k // TILE_K)
    values = [ctypes.c_uint64(out.data_ptr()), ctypes.c_uint64(clocks.data_ptr()), ctypes.c_int64(tiles),
              ctypes.c_int64(k_steps), ctypes.c_uint32(0x5EED)]
    args = driver.KernelArgs(values)
    stream = t.cuda.current_stream().cuda_stream

    def run(_: int) -> None:
        driver.check(d.cuLaunchKernel(fn, dev.sm_count, 1, 1, 256, 1, 1, shared_bytes(), d.CUstream(stream),
                                      args.address, 0), f"cuLaunchKernel({name})")

    probe = time_cuda(run, sets=1, reps=reps)
    t.cuda.synchronize()
    clk, ns = (int(x) for x in clocks.tolist())
    a = t.randn(m, k, device="cuda", dtype=t.bfloat16, generator=g)
    b = t.randn(n, k, device="cuda", dtype=t.bfloat16, generator=g)
    cublas = time_cuda(lambda _: a @ b.T, sets=1, reps=reps)
    flop = 2.0 * m * n * k
    waves = tiles / dev.sm_count
    mhz = clk / ns * 1e3 if ns else float("nan")
    result = {
        "m": m, "n": n, "k": k, "sms": dev.sm_count, "tiles": tiles, "waves": waves,
        "probe_us": probe["median_us"], "probe_tflops": flop / probe["median_us"] / 1e6,
        "cublas_us": cublas["median_us"], "cublas_tflops": flop / cublas["median_us"] / 1e6,
        "sm_mhz": mhz,
        # the tensor cores' peak at the measured clock, and the probe against it
        "peak_tflops_at_clock": FLOP_PER_CLOCK_PER_SM * dev.sm_count * mhz * 1e6 / 1e12,
    }
    result["probe_of_peak"] = result["probe_tflops"] / result["peak_tflops_at_clock"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    r = measure(args.m, args.n, args.k, args.reps)
    print(f"{args.m}x{args.n}x{args.k}: {r['tiles']} tiles of {TILE_M}x{TILE_N} on {r['sms']} SMs "
          f"({r['waves']:.2f} waves); wgmma alone {r['probe_us']:.1f} µs = {r['probe_tflops']:.0f} TFLOP/s "
          f"at {r['sm_mhz']:.0f} MHz ({100 * r['probe_of_peak']:.0f}% of {r['peak_tflops_at_clock']:.0f} at that clock); "
          f"cuBLAS {r['cublas_us']:.1f} µs = {r['cublas_tflops']:.0f} TFLOP/s")
    if args.json:
        args.json.write_text(json.dumps(r, indent=2))


if __name__ == "__main__":
    main()
