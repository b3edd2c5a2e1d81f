"""The packed call of torch users (`CallPlan._run_lean`): the same launches as the general path, with
outputs and intermediates from torch's allocator, on torch's current stream."""

from __future__ import annotations

import pytest

from habu.emit_cuda import driver, runtime
from habu.emit_cuda.arrays import ArgumentError
from habu.emit_cuda.runtime import CompiledModel
from tests.emit_cuda import fake_torch
from tests.emit_cuda.fakes import BASE, fake_gpu, gemm_model, gemm_plan


def _tensors(torch, ix_ptr: int = BASE + 0x200000, a_ptr: int = BASE):
    return {"A": torch.Tensor((4096, 512), torch.bfloat16, a_ptr),
            "B": torch.Tensor((512, 64), torch.bfloat16, BASE + 0x100000),
            "IX": torch.Tensor((32,), torch.int32, ix_ptr)}


def test_torch_tensors_take_the_lean_path_with_the_same_launches(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    torch = fake_torch.install(monkeypatch)
    model = CompiledModel(gemm_model(), gemm_plan())
    first = model(**_tensors(torch))
    (call,) = model._calls.values()
    assert call._lean
    began = len(cuda.calls)
    second = model(**_tensors(torch, ix_ptr=BASE + 0x300000))
    # the output C (4096 x 64 f32, row-major) and the intermediate T from torch's allocator, each call
    assert torch.allocated[-2:] == [((4096, 64), (64, 1), "float32"), ((4096, 64), (64, 1), "float32")]
    assert isinstance(second, torch.Tensor) and second.data_ptr() != first.data_ptr()
    ops = cuda.calls[began:]
    assert [c[0] for c in ops] == ["memset", "launch", "launch"]  # T zeroed, then k0 and k1
    assert all(c[3] == ("stream", 0x5EED) for c in ops[1:])  # torch's current stream
    k0, k1 = call.launches
    params = {p.tensor: i for i, p in enumerate(k0.kernel.params)}
    assert k0.args.values[params["IX"]].value == BASE + 0x300000
    t_ptr = k0.args.values[params["T"]].value
    assert ops[0][1] == t_ptr and k1.args.values[0].value == t_ptr  # k1 reads the T k0 wrote
    assert k1.args.values[1].value == second.data_ptr()


def test_a_misaligned_torch_tensor_is_refused_on_the_lean_path(monkeypatch):
    fake_gpu(monkeypatch, runtime, driver)
    torch = fake_torch.install(monkeypatch)
    model = CompiledModel(gemm_model(), gemm_plan())
    model(**_tensors(torch))
    with pytest.raises(ArgumentError, match=r"A: base address .* is not 16-byte aligned"):
        model(**_tensors(torch, a_ptr=BASE + 8))


def test_a_named_torch_stream_records_the_outputs_on_it(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    torch = fake_torch.install(monkeypatch)
    model = CompiledModel(gemm_model(), gemm_plan())
    side = type("Stream", (), {"cuda_stream": 0xAB})()
    out = model(stream=side, **_tensors(torch))  # the general path: the allocator must wait for `side`
    assert out.recorded == [side]
    assert [c[3] for c in cuda.calls if c[0] == "launch"] == [("stream", 0xAB)] * 2
