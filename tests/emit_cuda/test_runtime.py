"""CompiledModel: checks before launches, member choice, streams; end to end on a GPU (marked `gpu`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

try:  # torch is optional: only the torch interop test uses it
    import torch as TORCH
except Exception:  # pragma: no cover - absent on CPU machines
    TORCH = None

from habu.emit_cuda import driver, runtime
from habu.emit_cuda.arrays import ArgumentError
from habu.emit_cuda.guards import KernelSet
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan, Param
from habu.emit_cuda.runtime import CompiledModel, stream_handle
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Extent, Model, TensorDecl
from tests.emit_cuda.fakes import BASE, gemm_arrays, gemm_model, gemm_plan, info

# ----------------------------------------------------------------------------- a hand-written kernel

TWICE = r"""
extern "C" __global__ void habu_test_twice(const float* __restrict__ x, float* __restrict__ y, long long n) {
  extern __shared__ float unused[];
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) atomicAdd(&y[i], 2.0f * x[i]);  // adds: the runtime must zero y first
}
"""


class TwiceKernel(CudaKernel):
    """A kernel whose grid does not come from a lowering."""

    def grid(self, sizes, sm_count):
        return (-(-sizes["N"] // self.threads), 1, 1)


def twice_model() -> Model:
    return Model("twice", "equation", (Extent("N", None),), (TensorDecl("X", ("N",), DTYPES["f32"]),),
                 (TensorDecl("Y", ("N",), DTYPES["f32"]),), (), ())


def twice_plan(smem: int = 0) -> EmittedPlan:
    params = (Param("x", "ptr", "X", "f32"), Param("y", "ptr", "Y", "f32", writes=True), Param("n", "size", extent="N"))
    return EmittedPlan((TwiceKernel("habu_test_twice", TWICE, params, 256, smem, None, zero=("Y",)),), ())


@pytest.fixture
def no_driver(monkeypatch):
    """Fail the test if anything reaches the CUDA driver."""

    def touched(*args, **kwargs):
        raise AssertionError("the driver was called")

    for name in ("device", "launch", "init", "pointer_device", "copy_to_host", "memset_zero", "load_cubin"):
        monkeypatch.setattr(driver, name, touched)
    monkeypatch.setattr(runtime, "launch", touched)
    monkeypatch.setattr(runtime, "memset_zero", touched)


# ----------------------------------------------------------------------------- without a GPU


def test_precondition_failures_launch_nothing(no_driver):
    model = CompiledModel(twice_model(), twice_plan())
    with pytest.raises(ArgumentError, match="X: expected f32, got f16"):
        model(X=info((100,), "f16"))
    with pytest.raises(ArgumentError, match="X: missing"):
        model(Y=info((100,)))
    with pytest.raises(ArgumentError, match=r"Y: expected shape \(100,\)"):
        model(X=info((100,)), Y=info((99,), ptr=BASE + 4096))
    with pytest.raises(ArgumentError, match="not a GPU array"):
        model(X=[1.0, 2.0])


def test_kernel_set_members_are_chosen_by_guard_then_checked_strictly():
    tma, plain = gemm_plan(), replace(gemm_plan(), kernels=tuple(replace(k, params=tuple(
        p for p in k.params if p.kind != "tensormap"), lowering=None) for k in gemm_plan().kernels))
    model = CompiledModel(gemm_model(), KernelSet([("K%64 == 0", tma), ((), plain)]))
    assert model.check(gemm_arrays(k=512)) == (0, {"M": 4096, "K": 512, "N": 64, "S": 32})
    assert model.check(gemm_arrays(k=528))[0] == 1
    misaligned = {**gemm_arrays(k=528), "A": info((4096, 528), "bf16", BASE + 2)}
    assert model.check(misaligned)[0] == 1  # the fallback needs only element alignment
    misaligned = {**gemm_arrays(k=512), "A": info((4096, 512), "bf16", BASE + 2)}
    with pytest.raises(ArgumentError, match="not 16-byte aligned"):
        model.check(misaligned)


def test_regression_int64_index_is_checked_and_converted_even_without_check_indices(monkeypatch):
    host = {"IX": np.array([3, 0, 4095], np.int64)}
    monkeypatch.setattr(driver, "copy_to_host", lambda info, stream=0: host["IX"])
    for check_indices in (True, False):
        model = CompiledModel(gemm_model(), gemm_plan(), check_indices=check_indices)
        contract = model.contracts[0]
        arrays = {**gemm_arrays(s=3), "IX": info((3,), "i64", BASE + 0x200000)}
        converted = model._index_values(contract, arrays, {"M": 4096, "S": 3}, 0)
        assert list(converted) == ["IX"] and converted["IX"].dtype == np.int32
        assert converted["IX"].tolist() == [3, 0, 4095]
    host["IX"] = np.array([3, -1, 4095], np.int64)
    with pytest.raises(ArgumentError, match=r"IX: values must be in 0\.\.4095 \(an index into #M\): found -1 at IX\[1\]"):
        model._index_values(contract, arrays, {"M": 4096, "S": 3}, 0)
    # an i32 index is not copied at all when the model does not check indices
    monkeypatch.setattr(driver, "copy_to_host", lambda info, stream=0: pytest.fail("copied"))
    assert model._index_values(contract, gemm_arrays(s=3), {"M": 4096, "S": 3}, 0) == {}


def test_compile_needs_no_gpu(tmp_path):
    model = CompiledModel(twice_model(), twice_plan(), cache_dir=tmp_path)
    ((cubin,),) = model.compile("sm_90a")
    assert cubin.cubin.startswith(b"\x7fELF") and cubin.resources.registers > 0


class _TorchStream:
    cuda_stream = 0x1234


class _CupyStream:
    ptr = 0x5678


class _ProtocolStream:
    def __cuda_stream__(self):
        return (0, 0x9ABC)


def test_stream_handles():
    assert stream_handle(None, {}, 0) == 0
    assert stream_handle(77, {}, 0) == 77
    assert stream_handle(_TorchStream(), {}, 0) == 0x1234
    assert stream_handle(_CupyStream(), {}, 0) == 0x5678
    assert stream_handle(_ProtocolStream(), {}, 0) == 0x9ABC
    with pytest.raises(ArgumentError, match="cannot use a str as a CUDA stream"):
        stream_handle("fast", {}, 0)


# ----------------------------------------------------------------------------- on a GPU


@pytest.mark.gpu
def test_twice_end_to_end(tmp_path):
    dev = driver.device(0)
    n = 1000
    x = driver.DeviceArray((n,), "f32", dev)
    x.copy_from_host(np.arange(n, dtype=np.float32))
    model = CompiledModel(twice_model(), twice_plan(), cache_dir=tmp_path)
    y = model(X=x)
    assert isinstance(y, driver.DeviceArray) and y.shape == (n,)
    np.testing.assert_array_equal(y.to_host(), 2 * np.arange(n, dtype=np.float32))
    given = driver.DeviceArray((n,), "f32", dev)
    given.copy_from_host(np.full(n, 7.0, np.float32))  # zeroed before the kernel adds into it
    assert model(X=x, Y=given) is given
    np.testing.assert_array_equal(given.to_host(), 2 * np.arange(n, dtype=np.float32))


@pytest.mark.gpu
def test_large_dynamic_shared_memory(tmp_path):
    dev = driver.device(0)
    x = driver.DeviceArray((4096,), "f32", dev)
    x.copy_from_host(np.ones(4096, np.float32))
    y = CompiledModel(twice_model(), twice_plan(smem=100 * 1024), cache_dir=tmp_path)(X=x, stream=0)
    np.testing.assert_array_equal(y.to_host(), np.full(4096, 2.0, np.float32))


@pytest.mark.gpu
def test_failed_check_on_gpu_leaves_outputs_untouched(tmp_path):
    dev = driver.device(0)
    x = driver.DeviceArray((64,), "f16", dev)
    y = driver.DeviceArray((64,), "f32", dev)
    y.copy_from_host(np.full(64, 7.0, np.float32))
    with pytest.raises(ArgumentError, match="X: expected f32, got f16"):
        CompiledModel(twice_model(), twice_plan(), cache_dir=tmp_path)(X=x, Y=y)
    np.testing.assert_array_equal(y.to_host(), np.full(64, 7.0, np.float32))


@pytest.mark.gpu
def test_params_that_do_not_match_the_source_are_refused(tmp_path):
    dev = driver.device(0)
    x = driver.DeviceArray((64,), "f32", dev)
    plan = twice_plan()
    bad = replace(plan, kernels=(replace(plan.kernels[0], params=plan.kernels[0].params[:2]),))
    with driver.current(dev):
        probe = driver.load_cubin(CompiledModel(twice_model(), plan, cache_dir=tmp_path).compile(dev.arch)[0][0])
        if driver.param_count(probe.function(plan.kernels[0].name)) is None:
            pytest.skip("this driver has no cuFuncGetParamCount: a shorter Param list cannot be told apart "
                        "without an out-of-range query, which compute-sanitizer reports as an error")
    with pytest.raises(driver.DriverError, match="compiled parameters are"):
        CompiledModel(twice_model(), bad, cache_dir=tmp_path)(X=x)


@pytest.mark.gpu
def test_tensor_map_is_accepted_by_the_driver():
    dev = driver.device(0)
    if dev.arch == "sm_80":
        pytest.skip("tensor maps need sm_90 or later")
    a = driver.DeviceArray((256, 512), "bf16", dev)
    from habu.emit_cuda.kernel import TmaSpec

    args = driver.tensormap_args(TmaSpec("A", "bf16", ("K", "M"), (64, 128), 128), a.info, {"M": 256, "K": 512})
    with driver.current(dev):
        tm = driver.encode_tensormap(args)
    assert len(tm.opaque) == 16  # 128 bytes


@pytest.mark.gpu
def test_torch_tensors_in_and_out(tmp_path):
    # imported in a fresh interpreter state: torch 2.11's custom-op registration fails when it is
    # first imported from inside a test body after pytest's assertion rewriting (seen on the H200
    # image, 2026-11-30), so the import happens at collection time instead
    if TORCH is None:
        pytest.skip("torch is not installed")
    torch = TORCH
    x = torch.arange(300, dtype=torch.float32, device="cuda")
    y = CompiledModel(twice_model(), twice_plan(), cache_dir=tmp_path)(X=x)
    assert isinstance(y, torch.Tensor) and y.device == x.device
    torch.testing.assert_close(y, 2 * x)
