"""Bucketed runtime widths on the GPU (run through the device tool): every bucket's kernel, reached
through the call-time bucket lookup, is exact at both edges of its bucket (an integer-exact row
model, habu.timing.exact), and RMSNorm's bucketed build matches the float64 reference there."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.compile import compile_model, kernel_set  # noqa: E402
from habu.emit_cuda.runtime import CompiledModel  # noqa: E402
from habu.gpu_info import current_arch  # noqa: E402
from habu.paths.emit import emit  # noqa: E402
from habu.spec.parser import load_program, parse_text  # noqa: E402
from habu.target import target_named  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from habu.timing.harness import compare, make_inputs, poisoned_outputs, reference, tolerance  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

ROW_SCALE = """
64 EXTENT: #R
256..65536%256 EXTENT: #D
bf16 TENSOR: X ( #R #D )
f32 TENSOR: Y ( #R #D )
MODEL: ROW-SCALE  Y[r d] = X[r d] · Σ d' X[r d'] ;
"""


def bucketed(program, name: str, shape: dict[str, int]):
    tgt = target_named(current_arch())
    compiled = compile_model(program, name, shape, tgt, {}, trials=1)
    assert compiled.grid is not None and len(compiled.grid) == 9
    built = CompiledModel(compiled.model, kernel_set(compiled, [emit(p, tgt) for p in compiled.proofs]),
                          arch=tgt.name)
    return compiled, built


def edges(compiled):
    for i, plan in enumerate(compiled.plans):
        (_, lo, hi), = plan.ranges
        for d in sorted({lo, hi}):
            yield i, plan, d


def test_every_bucket_kernel_is_exact_at_its_bucket_edges():
    compiled, built = bucketed(parse_text(ROW_SCALE, "row_scale.habu"), "ROW-SCALE", {})
    for i, plan, d in edges(compiled):
        sizes = {"R": 64, "D": d}
        assert built.kernel_set.index(sizes) == i  # the lookup picks this bucket's kernel
        result = ExactChecker(compiled.model, sizes, seed=5).check(built, kept_types(plan))
        assert result.ok and result.applicable, (d, plan.ranges, result.reason())


def test_rmsnorm_bucketed_build_matches_the_reference_at_bucket_edges():
    program = load_program(ROOT / "examples" / "rmsnorm.habu")
    compiled, built = bucketed(program, "RMSNORM-ROWS", {"R": 64})
    for i, plan, d in edges(compiled):
        sizes = {"R": 64, "D": d}
        assert built.kernel_set.index(sizes) == i
        model = compiled.model.with_sizes(sizes)
        inputs = make_inputs(model, sizes, seed=11 + d)
        out = poisoned_outputs(model, sizes)
        got = built(**inputs, **out)
        torch.cuda.synchronize()
        golden = compare(got, reference(model, inputs, sizes)["Y"], tolerance(model, dict(plan.storage)))
        assert golden.ok, (d, plan.ranges, golden)


def test_the_timing_worker_times_a_bucket_plan_as_a_runtime_width(tmp_path):
    """A bucket search's candidates keep the width a runtime extent: the worker (its model bound to the
    bucket's widest, 8192) emits the bucket plan for a runtime width, exact-checks and times it."""
    from habu.timing.worker import GpuTimer

    src = tmp_path / "row_scale.habu"
    src.write_text(ROW_SCALE)
    compiled, _ = bucketed(parse_text(ROW_SCALE, str(src)), "ROW-SCALE", {})
    plan = compiled.plans[5]
    assert plan.ranges == (("D", 4352, 8192),)
    timer = GpuTimer(str(src), "ROW-SCALE", {"R": 64, "D": 8192})
    try:
        assert timer.start() is not None, timer.unavailable
        m = timer.measure(plan.to_json())
        assert m.ok, m.reason
        assert m.exact and m.exact["ok"] and m.exact["applicable"]
    finally:
        timer.close()
