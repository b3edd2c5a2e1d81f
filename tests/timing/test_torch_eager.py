"""The eager baseline's choices that need no GPU (a stand-in torch): which type elementwise ops run in."""

from __future__ import annotations

from types import SimpleNamespace

from habu.spec.evaluate import Labelled
from habu.timing.torch_eager import TorchEager

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


def test_a_bias_row_is_read_as_a_view_not_gathered():
    """Regression: B1[0 h] went through the gather path, three small kernels (arange, fill,
    indexing) per call of the FFN-SKIP baseline; a constant position now selects a view."""
    import numpy as np

    from habu.spec.ir import IndexConst, IndexVar, Load

    run = _runner()
    bias = np.arange(12.0).reshape(2, 6)
    run.env = {"B1": bias}
    h = IndexVar("h", "H")
    got = run.load(Load("B1", (IndexConst(1), h)))
    assert got.labels == (h,) and np.shares_memory(got.data, bias)
    assert got.data.tolist() == [6.0, 7.0, 8.0, 9.0, 10.0, 11.0]
