"""A call without a host round trip: checked once per argument layout, then only launched (no copy from
the device, no synchronisation), and index errors found on the device reported by check_errors."""

from __future__ import annotations

import numpy as np
import pytest

from habu.emit_cuda import device_errors, driver, runtime
from habu.emit_cuda.arrays import ArgumentError
from habu.emit_cuda.device_errors import ErrorWords, IndexValueError, describe
from habu.emit_cuda.runtime import CompiledModel
from tests.emit_cuda.fakes import BASE, fake_gpu, gemm_arrays, gemm_model, gemm_plan, info


def _launches(cuda):
    return [c for c in cuda.calls if c[0] == "launch"]


def test_a_second_call_of_the_same_layout_is_not_checked_again(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = CompiledModel(gemm_model(), gemm_plan())
    checked = []
    real = runtime.check_arguments
    monkeypatch.setattr(runtime, "check_arguments", lambda *a, **k: checked.append(1) or real(*a, **k))
    first = model(**gemm_arrays())
    after_first = len(checked)
    second = model(**{**gemm_arrays(), "IX": info((32,), "i32", BASE + 0x300000)})
    assert after_first > 0 and len(checked) == after_first  # the layout's checks ran once
    assert len(_launches(cuda)) == 4  # k0 and k1, twice
    assert first.ptr != 0 and second.ptr != 0  # outputs allocated per call


def test_the_new_pointers_reach_the_packed_arguments(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = CompiledModel(gemm_model(), gemm_plan())
    model(**gemm_arrays())
    model(**{**gemm_arrays(), "IX": info((32,), "i32", BASE + 0x300000)})
    (call,) = model._calls.values()
    k0 = call.launches[0]
    ix = next(i for i, p in enumerate(k0.kernel.params) if p.tensor == "IX")
    assert k0.args.values[ix].value == BASE + 0x300000
    # the memset before k0 zeroes this call's T (an intermediate allocated per call)
    assert [c[0] for c in cuda.calls[:2]] == ["memset", "launch"]


def test_a_tensor_map_is_encoded_once_per_pointer(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = CompiledModel(gemm_model(), gemm_plan())
    for _ in range(3):
        model(**gemm_arrays())
    moved = {**gemm_arrays(), "A": info((4096, 512), "bf16", BASE + 0x400000)}
    model(**moved)
    model(**moved)
    assert cuda.encoded.count(BASE) == 1 and cuda.encoded.count(BASE + 0x400000) == 1


def test_a_misaligned_pointer_is_refused_on_the_packed_path(monkeypatch):
    fake_gpu(monkeypatch, runtime, driver)
    model = CompiledModel(gemm_model(), gemm_plan())
    model(**gemm_arrays())
    with pytest.raises(ArgumentError, match=r"A: base address .* is not 16-byte aligned"):
        model(**{**gemm_arrays(), "A": info((4096, 512), "bf16", BASE + 8)})


def test_a_layout_that_fails_its_checks_is_not_remembered(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = CompiledModel(gemm_model(), gemm_plan())
    for _ in range(2):
        with pytest.raises(ArgumentError, match="IX: expected i32"):
            model(**{**gemm_arrays(), "IX": info((32,), "f32", BASE + 0x200000)})
    assert model._calls == {} and _launches(cuda) == []


def test_device_mode_never_copies_index_values_to_the_host(monkeypatch):
    fake_gpu(monkeypatch, runtime, driver)  # copy_to_host fails the test
    for mode in ("device", True, False):
        model = CompiledModel(gemm_model(), gemm_plan(), check_indices=mode)
        assert model.check_indices == "device"
        model(**gemm_arrays())
    with pytest.raises(ArgumentError, match="check_indices"):
        CompiledModel(gemm_model(), gemm_plan(), check_indices="sometimes")


def test_host_mode_copies_and_checks_every_call(monkeypatch):
    fake_gpu(monkeypatch, runtime, driver)
    copied = []

    def copy(info, stream=0):
        copied.append(info.ptr)
        return np.array([0, 5, 4096] if len(copied) > 1 else [0, 5, 7], np.int32)

    monkeypatch.setattr(driver, "copy_to_host", copy)
    monkeypatch.setattr(device_errors, "_registry", [])
    monkeypatch.setattr(runtime.CompiledModel, "_plan_call", lambda *a: pytest.fail("packed path used"))
    model = CompiledModel(gemm_model(), gemm_plan(), check_indices="host")
    model(**gemm_arrays(s=3))
    with pytest.raises(ArgumentError, match=r"IX: values must be in 0\.\.4095 \(an index into #M\): found 4096 at IX\[2\]"):
        model(**gemm_arrays(s=3))
    assert len(copied) == 2


def _words(tables=(("IX", "M"), ("JX", "N"))) -> ErrorWords:
    return ErrorWords("GGEMM", "habu_ggemm_k0", tables, driver.Device(0, None, None, "sm_90a", 132), 0x1000)


def _raw(flags: int, code: int, position: int, value: int, size: int) -> np.ndarray:
    def lohi(v: int) -> list[int]:
        v &= (1 << 64) - 1
        return [v & 0xFFFFFFFF, v >> 32]

    return np.array([flags, code + 1, *lohi(position), *lohi(value), *lohi(size)], np.uint32)


def test_error_words_read_as_the_host_checks_message():
    text = describe(_words(), _raw(0b1, 0, 8, 4096, 4096))
    assert text is not None and text.startswith(
        "IX: values must be in 0..4095 (an index into #M): found 4096 at IX[8] (found on the device by kernel "
        "habu_ggemm_k0 of GGEMM")
    assert describe(_words(), np.zeros(8, np.uint32)) is None


def test_error_words_keep_negative_values_and_name_every_bad_tensor():
    text = describe(_words(), _raw(0b11, 1, 3, -1, 128))
    assert text is not None and "JX: values must be in 0..127 (an index into #N): found -1 at JX[3]" in text
    assert "IX also held values out of range" in text


class _WordsCuda:
    """A driver whose only memory is one module's error words."""

    def __init__(self, raw):
        self.raw, self.synced = raw, 0

    def CUdeviceptr(self, p):
        return p

    def cuCtxSynchronize(self):
        self.synced += 1
        return (0,)

    def cuMemcpyDtoH(self, dst, src, nbytes):
        np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint32 * 8).from_address(dst))[:] = self.raw
        return (0,)

    def cuMemcpyHtoD(self, dst, src, nbytes):
        self.raw[:] = 0
        return (0,)


def test_check_errors_synchronises_reports_once_and_clears(monkeypatch):
    cuda = _WordsCuda(_raw(0b1, 0, 8, 4096, 4096))
    monkeypatch.setattr(driver, "init", lambda: cuda)
    monkeypatch.setattr(driver, "check", lambda result, what: None)
    monkeypatch.setattr(driver, "current", lambda d: __import__("contextlib").nullcontext(d))
    monkeypatch.setattr(device_errors, "_registry", [_words()])
    with pytest.raises(IndexValueError, match=r"IX: values must be in 0\.\.4095 .* found 4096 at IX\[8\]"):
        device_errors.check_errors()
    assert cuda.synced == 1 and not cuda.raw.any()
    device_errors.check_errors()  # reported once: the words were cleared
    device_errors.check_errors(device=1)  # no module there: nothing to read
    assert cuda.synced == 2


def test_regression_narrowing_an_int64_index_never_wraps_a_bad_value_into_range():
    torch = pytest.importorskip("torch")
    from habu.emit_cuda.call_plan import narrow_index

    wide = torch.tensor([3, -1, (1 << 32) + 5, -(1 << 40), 4095], dtype=torch.int64)
    narrow = narrow_index(torch, wide, "i32")
    assert narrow.dtype == torch.int32
    assert narrow.tolist() == [3, -1, (1 << 31) - 1, -(1 << 31), 4095]  # 2^32 + 5 would wrap to 5


GATHER_ROWS = r"""
#include "habu/habu.cuh"
extern "C" __global__ void gather_rows(const float* __restrict__ a, const int* __restrict__ ix, float* __restrict__ o,
                                       long long rows, long long n) {
  long long r = blockIdx.x, c = threadIdx.x;
  const bool ok = r < n && habu::index_ok((long long)ix[r], rows, 0u, r);
  o[r * 32 + c] = ok ? a[(long long)ix[r] * 32 + c] : 0.0f;
}
"""


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_the_index_check_compiles_and_its_module_carries_the_error_words(arch):
    from habu.emit_cuda.nvrtc import compile_cuda

    cubin = compile_cuda(GATHER_ROWS, "gather_rows", arch).cubin
    assert device_errors.SYMBOL in cubin  # what cuModuleGetGlobal finds after loading


def test_regression_serialised_launches_reach_a_call_packed_before(monkeypatch):
    """habu.bench.kernel_times.serial_launches patched `driver.overlaps_launches`, which a CompiledModel's
    CallPlan reads once, when the first call of a layout builds it: a call packed before the block still
    launched its kernels early, and their profiled times counted the wait for the previous kernel (the
    4096-token step's forward rows kernel read 184.8 µs behind its GEMM on the H200, session 33)."""
    from habu.bench.kernel_times import serial_launches

    fake_gpu(monkeypatch, runtime, driver)
    monkeypatch.setattr(driver, "overlaps_launches", lambda d: True)
    early: list[str] = []
    monkeypatch.setattr(driver, "launch_function", lambda fn, grid, threads, smem, stream, args, name, pdl:
                        early.append(name))
    from dataclasses import replace

    plan = gemm_plan()
    k0, k1 = plan.kernels
    waits = replace(plan, kernels=(k0, replace(k1, source="habu::grid_dependency_wait();")))  # k1 may start early
    model = CompiledModel(gemm_model(), waits)
    model(**gemm_arrays())
    packed = len(early)
    assert packed > 0  # the second kernel launched early
    with serial_launches():
        model(**gemm_arrays())
    assert len(early) == packed  # none early inside the block
    model(**gemm_arrays())
    assert len(early) == 2 * packed  # and early again after it
