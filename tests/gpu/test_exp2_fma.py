"""habu::exp2_fma (habu/emit_cuda/include/habu/attention/online.cuh), the exponential the attention kernels run
on the FMA pipes for `exp_fma` of every 8 score groups, on the GPU over every float32 from −130 to 1 by steps of
2^−12 and the special values: within 1.2e-4 of 2^x (relative) down to 2^−125, exactly +0 for x ≤ −127 and −∞ (a
masked score), never negative (not monotone: at x = n + 1/2 the polynomial's
errors at f = ±1/2 meet, a step of ≤ 2.2e-4 relative); beside it the SFU's exp2_fast, as a reference for
the error the kernels had.

Run: python -m pytest -q tests/gpu/test_exp2_fma.py (on the device machine)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

SOURCE = """#include <habu/attention/online.cuh>
extern "C" __global__ void habu_exp2_probe(const float* x, float* fma, float* sfu, long long n) {
  const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    fma[i] = habu::exp2_fma(x[i]);
    sfu[i] = habu::exp2_fast(x[i]);
  }
}
"""


def exponentials(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    from habu.emit_cuda import driver
    from habu.emit_cuda.nvrtc import compile_cuda

    torch.cuda.init()
    dev = driver.device(0)
    name = "habu_exp2_probe"
    cubin = compile_cuda(SOURCE, name, dev.arch)
    d = driver._driver()
    xs = torch.from_numpy(x).cuda()
    fma, sfu = torch.full_like(xs, float("nan")), torch.full_like(xs, float("nan"))
    args = driver.KernelArgs([ctypes.c_uint64(xs.data_ptr()), ctypes.c_uint64(fma.data_ptr()),
                              ctypes.c_uint64(sfu.data_ptr()), ctypes.c_int64(x.size)])
    with driver.current(dev):
        fn = driver.load_cubin(cubin).function(name)
        stream = torch.cuda.current_stream().cuda_stream
        driver.check(d.cuLaunchKernel(fn, -(-x.size // 256), 1, 1, 256, 1, 1, 0, d.CUstream(stream), args.address, 0),
                     name)
        torch.cuda.synchronize()
    return fma.cpu().numpy(), sfu.cpu().numpy()


def test_exp2_fma_is_2_to_the_x_within_bf16_s_needs_and_0_where_the_sfu_flushes():
    grid = np.arange(-130 * 4096, 4096 + 1, dtype=np.int64).astype(np.float32) / np.float32(4096)
    special = np.array([-np.inf, -1e30, -127.0, np.nextafter(np.float32(-127), 0), -126.5, -126.0, -125.0, -0.0,
                        1e-7, np.nextafter(np.float32(0), 1)], dtype=np.float32)
    x = np.concatenate([grid, special])
    fma, sfu = exponentials(x)
    exact = np.exp2(x.astype(np.float64))
    assert np.all(np.isfinite(fma)) and np.all(fma >= 0), "exp2_fma gave a negative, infinite or NaN value"
    normal = x >= -125
    rel = np.abs(fma[normal] - exact[normal]) / exact[normal]
    assert rel.max() <= 1.2e-4, f"exp2_fma: relative error {rel.max():.2e} at x = {x[normal][rel.argmax()]}"
    assert np.all(fma[x <= -127] == 0), "2^x for x ≤ −127 (and −∞, a masked score) must be exactly 0"
    assert np.all(fma[(x > -127) & (x < -125)] < 2.0 ** -124)
    sfu_rel = np.abs(sfu[normal & (x >= -100)] - exact[normal & (x >= -100)]) / exact[normal & (x >= -100)]
    print(f"max relative error: exp2_fma {rel.max():.2e}, ex2.approx {sfu_rel.max():.2e}")
