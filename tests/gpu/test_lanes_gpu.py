"""`Plan.lanes` 2 on the GPU (habu/plan/lanes.py): FFN-SKIP's backward with its weight gradients on a side stream
beside the products that read the weights, against the float64 reference (every element written), called many
times back to back (a missing event would let dX's product read a dT2 the next call is writing), and captured in
a CUDA graph (the fork and join are the graph's edges) and replayed on new values."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

import habu  # noqa: E402
from habu.compile import compile_model, kernel_set  # noqa: E402
from habu.emit_cuda.runtime import CompiledModel  # noqa: E402
from habu.gpu_info import current_arch  # noqa: E402
from habu.paths.emit import emit  # noqa: E402
from habu.spec.grad_program import with_backward  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
from habu.target import target_named  # noqa: E402
from habu.timing.harness import make_inputs  # noqa: E402
from tests.conftest import ROOT  # noqa: E402
from tests.gpu.test_backward_gpu import assert_ffn_gradients_match  # noqa: E402

SHAPE = {"B": 128, "D": 512, "H": 1024}


@pytest.fixture(scope="module")
def two_lanes():
    tgt = target_named(current_arch())
    program = with_backward(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP-GRAD")
    compiled = compile_model(program, "FFN-SKIP-GRAD", SHAPE, tgt, {"tile": "128x128x64", "lanes": "2"}, trials=1)
    assert compiled.plans[0].lanes == 2
    built = CompiledModel(compiled.model, kernel_set(compiled, [emit(p, tgt) for p in compiled.proofs]), arch=tgt.name)
    return compiled, built


def test_the_two_lane_ffn_backward_matches_the_float64_reference(two_lanes):
    compiled, built = two_lanes
    assert_ffn_gradients_match(compiled, built, SHAPE, seed=9)
    (call,) = built._calls.values()
    assert call.schedule is not None and {s.lane for s in call.schedule} == {0, 1}


def test_back_to_back_two_lane_calls_give_one_calls_result(two_lanes):
    compiled, built = two_lanes
    sizes = {e.name: e.size for e in compiled.model.with_sizes(SHAPE).extents}
    inputs = [make_inputs(compiled.model.with_sizes(SHAPE), sizes, seed=s) for s in (1, 2)]
    alone = [{k: v.clone() for k, v in built(**x).items()} for x in inputs]
    torch.cuda.synchronize()
    for _ in range(20):  # alternate, never synchronising: each call's lanes after the one before
        got = [built(**x) for x in inputs]
    torch.cuda.synchronize()
    for g, a in zip(got, alone, strict=True):
        for name in a:
            assert torch.equal(g[name], a[name]) or _rel(g[name], a[name]) <= 1e-6, name


def test_the_two_lane_ffn_backward_is_captured_and_replayed(two_lanes):
    compiled, built = two_lanes
    model = compiled.model.with_sizes(SHAPE)
    sizes = {e.name: e.size for e in model.extents}
    static = make_inputs(model, sizes, seed=3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            built(**static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = built(**static)
    for name, value in make_inputs(model, sizes, seed=4).items():
        static[name].copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    eager = built(**static)
    torch.cuda.synchronize()
    for name in eager:
        assert _rel(captured[name], eager[name]) <= 1e-3, name
    habu.check_errors()


def _rel(got, want) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm().clamp_min(1e-30))
