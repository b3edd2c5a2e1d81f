"""Every example's default kernels compile without a compiler warning, on every recorded target: a kernel
that declares a variable it never reads, or a header loop NVRTC finds unreachable, buries the warnings
that matter (a wgmma serialised, a spill) in noise. A warning NVRTC prints for a kernel is a test failure
naming the example, the model, the target and the warning."""

from __future__ import annotations

import re

import pytest

from habu.emit_cuda.nvrtc import compile_cuda
from habu.paths.emit import emit_plan
from habu.target import TARGETS
from tests.emit_cuda.emitted_snapshot import default_cases

WARNING = re.compile(r"warning #\d+-D: [^\n]*")


@pytest.mark.slow
def test_every_examples_default_kernels_compile_without_warnings():
    found = []
    for cid, model, plan, arch in default_cases():
        for kernel in emit_plan(model, plan, TARGETS[arch]).kernels:
            log = compile_cuda(kernel.source, kernel.name, arch).log
            found += [f"{cid} {kernel.name}: {w}" for w in WARNING.findall(log)]
    assert not found, "\n".join(found[:12])


@pytest.mark.parametrize("example,model,sizes", [
    ("rmsnorm.habu", "RMSNORM-ROWS", None),  # col, row_cache_all and row_cache were declared unread
    ("scatter_add.habu", "UNPERMUTE", None),  # red_add_vec<4>'s fallback loop after a return: "not reachable"
    pytest.param("moe_mixtral.habu", "MOE-FFN", {"T": 256, "R": 512},  # the consumers' n0 (only the producer reads it)
                 marks=pytest.mark.slow),  # (25 s: two grouped kernels through NVRTC)
])
def test_regression_kernels_declared_variables_they_never_read(example, model, sizes):
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / example).models[model]
    m = m.with_sizes(sizes) if sizes else m
    plan = default_plan(m, TARGETS["sm_90a"], sizes, {})
    for kernel in emit_plan(m, plan, TARGETS["sm_90a"]).kernels:
        log = compile_cuda(kernel.source, kernel.name, "sm_90a").log
        assert not WARNING.findall(log), log
