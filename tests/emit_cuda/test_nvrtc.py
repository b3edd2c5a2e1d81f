"""NVRTC compiles, resource reports, compile errors, and the nvcc fallback."""

from __future__ import annotations

import shutil

import pytest

from habu.emit_cuda import nvrtc
from habu.emit_cuda.nvrtc import CompileError, CompilerUnavailable, Resources, compile_cuda, parse_ptxas
from habu.errors import HabuError

DOUBLE = r"""
extern "C" __global__ void twice(const float* __restrict__ x, float* __restrict__ y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
"""

# 64 live accumulators under a 32-register cap: ptxas must spill
SPILL = r"""
extern "C" __global__ void spill(const float* x, float* y, int n) {
  float a[64];
#pragma unroll
  for (int i = 0; i < 64; i++) a[i] = x[threadIdx.x + i * n];
  for (int j = 0; j < n; j++) {
#pragma unroll
    for (int i = 0; i < 64; i++) a[i] = a[i] * a[(i + 1) & 63] + x[j];
  }
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 64; i++) s += a[i] * (float)i;
  y[threadIdx.x] = s;
}
"""

SMEM = r"""
extern "C" __global__ void staged(const float* x, float* y) {
  __shared__ float tile[256];
  tile[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  y[threadIdx.x] = tile[255 - threadIdx.x];
}
"""


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80", "sm_100a"])
def test_compiles_and_reports_registers(arch):
    c = compile_cuda(DOUBLE, "twice", arch)
    assert c.cubin.startswith(b"\x7fELF")
    assert c.arch == arch
    assert c.compiler.startswith("nvrtc ")
    assert c.resources.registers > 0
    assert not c.resources.spills
    assert "twice" in c.log


def test_static_shared_memory_is_reported():
    c = compile_cuda(SMEM, "staged", "sm_90a")
    assert c.resources.smem == 1024
    assert c.resources.describe() == f"{c.resources.registers} registers, 0 spills, 1024 B static smem"


def test_spills_are_detected():
    c = compile_cuda(SPILL, "spill", "sm_90a", extra_options=["--maxrregcount=32"])
    assert c.resources.registers <= 32
    assert c.resources.spills
    assert c.resources.spill_stores > 0 and c.resources.spill_loads > 0
    assert "spilled" in c.resources.describe()


def test_syntax_error_gives_compile_error_with_log():
    with pytest.raises(CompileError) as info:
        compile_cuda(DOUBLE + "\nthis is not C++;\n", "twice", "sm_90a")
    text = info.value.render()
    assert "twice" in text and "sm_90a" in text
    assert "error" in text
    assert "Traceback" not in text


def test_long_logs_are_cut():
    bad = "\n".join(f"int f{i}() {{ return undefined_{i}; }}" for i in range(60))
    with pytest.raises(CompileError) as info:
        compile_cuda(bad, "nothing", "sm_80")
    assert "more lines" in str(info.value)
    assert len(str(info.value).splitlines()) <= nvrtc.LOG_LINES + 3


def test_include_dirs_are_searched(tmp_path):
    (tmp_path / "habu_test_helper.cuh").write_text("__device__ inline float thrice(float v) { return 3.f * v; }\n")
    src = '#include "habu_test_helper.cuh"\nextern "C" __global__ void k(float* x) { x[0] = thrice(x[0]); }\n'
    assert compile_cuda(src, "k", "sm_80", include_dirs=[tmp_path]).resources.registers > 0


def test_unknown_arch_is_refused():
    with pytest.raises(HabuError, match="sm_75"):
        compile_cuda(DOUBLE, "twice", "sm_75")


NVRTC_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spill' for 'sm_90a'
ptxas info    : Function properties for spill
ptxas         .     272 bytes stack frame, 496 bytes spill stores, 488 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 272 bytes cumulative stack size
ptxas info    : Compile time = 33.295 ms
ptxas info    : Function properties for _Z6helperv
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'gemm' for 'sm_90a'
ptxas info    : Function properties for gemm
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 368 bytes cmem[0]
"""


def test_parse_ptxas():
    table = parse_ptxas(NVRTC_LOG)
    assert set(table) == {"spill", "gemm"}  # a device function has no register report of its own
    assert table["spill"] == Resources(registers=32, spill_stores=496, spill_loads=488, smem=0, stack=272)
    assert table["gemm"] == Resources(registers=168, smem=1024)
    assert table["gemm"].describe() == "168 registers, 0 spills, 1024 B static smem"
    assert table["spill"].describe() == "32 registers, 984 B spilled, 0 B static smem, 272 B stack"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_nvcc_fallback(monkeypatch):
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: None)
    c = compile_cuda(DOUBLE, "twice", "sm_90a")
    assert c.compiler.startswith("nvcc ")
    assert c.cubin.startswith(b"\x7fELF")
    assert c.resources.registers > 0
    with pytest.raises(CompileError, match="nvcc"):
        compile_cuda(DOUBLE + "\nnot C++;\n", "twice", "sm_90a")


def test_no_compiler_says_how_to_install(monkeypatch):
    monkeypatch.setattr(nvrtc, "_nvrtc", lambda: None)
    monkeypatch.setattr(nvrtc.shutil, "which", lambda name: None)
    with pytest.raises(CompilerUnavailable, match="pip install nvidia-cuda-nvrtc"):
        compile_cuda(DOUBLE, "twice", "sm_90a")


def test_parse_ptxas_names_a_kernel_whose_wgmma_ptxas_serialized():
    """ptxas's C7512 note (the short full-attention prefill's kernel, session 38: 80 µs where the loop's form
    ran 67) is kept with the kernel's resources and shown in their line."""
    log = NVRTC_LOG + ("ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are "
                       "serialized due to insufficient register resources for the function 'gemm'\n")
    table = parse_ptxas(log)
    assert table["gemm"].wgmma_serialized and not table["spill"].wgmma_serialized
    assert table["gemm"].describe().endswith(", wgmma serialized by ptxas")
