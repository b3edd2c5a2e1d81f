"""The device-side narrowing of index tensors (habu.emit_cuda.narrow) compiles for every pair it offers."""

from __future__ import annotations

import pytest

from habu.emit_cuda.narrow import _KERNELS, can_narrow, narrowing_source
from habu.emit_cuda.nvrtc import CompilerUnavailable, compile_cuda


def test_the_narrowing_module_compiles_with_every_entry_point():
    try:
        cubin = compile_cuda(narrowing_source(), "habu_narrow_index_i64_i32", "sm_90a")
    except CompilerUnavailable:
        pytest.skip("no NVRTC here")
    for name, *_ in _KERNELS.values():
        assert name.encode() in cubin.cubin
    assert cubin.resources.spill_stores == 0


def test_only_narrowing_pairs_are_offered():
    assert can_narrow("i64", "i32") and can_narrow("i64", "i16") and can_narrow("i32", "i16")
    assert not can_narrow("i32", "i64") and not can_narrow("i32", "i32")
