"""The eager baseline's choices that need no GPU (a stand-in torch): which type elementwise ops run in."""

from __future__ import annotations

from types import SimpleNamespace

from habu.bench.torch_eager import TorchEager
from habu.spec.evaluate import Labelled

TORCH = SimpleNamespace(bfloat16="bf16", float16="f16", float32="f32")


def _tensor(dtype: str, dims: int) -> Labelled:
    return Labelled(SimpleNamespace(dtype=dtype, dim=lambda: dims), ())


def _runner() -> TorchEager:
    run = object.__new__(TorchEager)  # without __init__: it imports torch
    run.torch = TORCH
    return run


def test_ffn_skip_bias_add_stays_bf16_in_the_eager_baseline():
    """Regression: every elementwise operand was upcast to f32, so FFN-SKIP's bias and residual adds
    ran as cast and f32 kernels and its baseline took 1.75x the hand-written torch."""
    run = _runner()
    assert run.elementwise_dtype([_tensor("bf16", 2), _tensor("bf16", 2)]) == "bf16"
    assert run.elementwise_dtype([_tensor("f16", 2), _tensor("f32", 0)]) == "f16"  # a constant keeps f16


def test_mixed_or_f32_operands_run_in_f32():
    run = _runner()
    assert run.elementwise_dtype([_tensor("bf16", 2), _tensor("f32", 1)]) == "f32"  # e.g. a row's rsqrt
    assert run.elementwise_dtype([_tensor("bf16", 2), _tensor("f16", 2)]) == "f32"
    assert run.elementwise_dtype([_tensor("f32", 0)]) == "f32"
