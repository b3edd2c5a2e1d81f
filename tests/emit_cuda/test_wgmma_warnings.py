"""The wgmma kernels compile without NVRTC's "declared but never referenced" warnings: the producer's
k0 only where a cp.async copy reads it (a TMA copy prints its coordinate whole), the TMA-store
epilogue's element coordinates m and n only where the epilogue reads them, and the generic pointer
`smem` only where a copy or the epilogue writes through it."""

from __future__ import annotations

import re

import pytest

from habu.emit_cuda.nvrtc import compile_cuda
from habu.paths.emit import emit_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
UNUSED = re.compile(r'warning #177-D: variable "(\w+)" was declared but never referenced')


def _wgmma_kernels(example: str, model: str, pins: dict[str, str]):
    m = load_program(ROOT / "examples" / example).models[model]
    sizes = {e.name: 4096 for e in m.extents if not e.is_static} or None
    plan = default_plan(m, TARGET, sizes, pins)
    kernels = [k for k in emit_plan(m, plan, TARGET).kernels if "wgmma" in k.source.splitlines()[0]]
    assert kernels, "no wgmma kernel in the plan"
    return kernels


@pytest.mark.parametrize("example,model,pins,kept", [
    ("gemm.habu", "GEMM", {}, {"smem"}),  # TMA loads, TMA store: no k0, m or n; the staged box through smem
    ("gemm.habu", "GEMM", {"A": "cp.async", "store": "direct"}, {"k0", "m", "n"}),  # k0 by the copies, m n by the masks
])
def test_regression_wgmma_kernels_declare_no_variable_they_never_read(example, model, pins, kept):
    for kernel in _wgmma_kernels(example, model, pins):
        log = compile_cuda(kernel.source, kernel.name, "sm_90a").log
        assert not UNUSED.findall(log), log
        declared = {name for name in ("k0", "m", "n", "smem")
                    if re.search(rf"\b(?:int|long long|unsigned char\*) {name} = ", kernel.source)}
        assert declared == kept, declared
