"""`Plan.lanes` 2 on the packed call: the kernels that share no tensor launch on a side stream, forked from the
caller's stream before them and joined back after them (habu.plan.lanes), with a stand-in driver."""

from __future__ import annotations

import pytest

from habu.emit_cuda import call_plan, driver, runtime
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan, Param
from habu.emit_cuda.runtime import CompiledModel
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Extent, Model, TensorDecl
from tests.emit_cuda.fakes import BASE, fake_gpu, info

pytestmark = pytest.mark.usefixtures("fresh_side_streams")


@pytest.fixture
def fresh_side_streams(monkeypatch):
    monkeypatch.setattr(call_plan, "_SIDE_STREAMS", {})


def two_output_model() -> Model:
    """C = f(T), T = g(A, B), and D = h(A): D's kernel shares nothing with T's and C's."""
    extents = (Extent("M", 64), Extent("N", 64))
    f32 = DTYPES["f32"]
    inputs = (TensorDecl("A", ("M", "N"), f32), TensorDecl("B", ("M", "N"), f32))
    outputs = (TensorDecl("C", ("M", "N"), f32), TensorDecl("D", ("M", "N"), f32))
    return Model("two", "equation", extents, inputs, outputs, (TensorDecl("T", ("M", "N"), None),), ())


def ptr(name: str, writes: bool = False) -> Param:
    return Param(f"p_{name}", "ptr", name, "f32", writes=writes)


def three_kernels(lanes: int) -> EmittedPlan:
    k0 = CudaKernel("k0", "", (ptr("A"), ptr("B"), ptr("T", True)), 128, 0, None)
    k1 = CudaKernel("k1", "", (ptr("T"), ptr("C", True)), 128, 0, None)
    k2 = CudaKernel("k2", "", (ptr("A"), ptr("D", True)), 128, 0, None, zero=("D",))
    return EmittedPlan((k0, k1, k2), (("T", "f32", ("M", "N")),), lanes)


def arrays():
    return {"A": info((64, 64)), "B": info((64, 64), ptr=BASE + 0x100000)}


def test_a_kernel_that_shares_nothing_runs_on_the_side_stream_between_a_fork_and_a_join(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = CompiledModel(two_output_model(), three_kernels(2))
    model(**arrays())
    (call,) = model._calls.values()
    assert [(s.launch, s.lane) for s in call.schedule] == [(0, 0), (2, 1), (1, 0)]
    calls = [c for c in cuda.calls if c[0] in ("launch", "memset", "record", "wait")]
    main, side = ("stream", 0), ("stream", 0x5EED)
    kinds = [(c[0], c[1] if c[0] == "launch" else None) for c in calls]
    assert kinds == [("record", None), ("wait", None), ("launch", "k0"), ("memset", None), ("launch", "k2"),
                     ("launch", "k1"), ("record", None), ("wait", None)]
    fork_record, fork_wait, k0, memset, k2, k1, join_record, join_wait = calls
    assert fork_record[2] == main and fork_wait[1] == side and fork_wait[2] == fork_record[1]
    assert k0[3] == main and k1[3] == main and k2[3] == side and memset[3] == side  # D's zero fill on its lane
    assert join_record[2] == side and join_wait[1] == main and join_wait[2] == join_record[1]


def test_a_side_stream_and_the_events_are_made_once(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = CompiledModel(two_output_model(), three_kernels(2))
    for _ in range(3):
        model(**arrays())
    assert sum(c[0] == "stream" for c in cuda.calls) == 1
    assert sum(c[0] == "event" for c in cuda.calls) == 2  # the fork and the join: no launch is waited for


def test_one_lane_launches_in_order_on_the_callers_stream(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    model = CompiledModel(two_output_model(), three_kernels(1))
    model(**arrays())
    assert [c[1] for c in cuda.calls if c[0] == "launch"] == ["k0", "k1", "k2"]
    assert not any(c[0] in ("record", "wait", "stream") for c in cuda.calls)


def test_a_chain_has_no_side_lane(monkeypatch):
    cuda = fake_gpu(monkeypatch, runtime, driver)
    plan = three_kernels(2)
    chained = EmittedPlan((plan.kernels[0], plan.kernels[1],
                           CudaKernel("k2", "", (ptr("C"), ptr("D", True)), 128, 0, None)), plan.intermediates, 2)
    model = CompiledModel(two_output_model(), chained)
    model(**arrays())
    (call,) = model._calls.values()
    assert call.schedule is None and not any(c[0] in ("record", "wait") for c in cuda.calls)


def waiting(name: str, *params: Param) -> CudaKernel:
    """A kernel whose source waits for the previous one (griddepcontrol.wait): it may launch early."""
    return CudaKernel(name, "habu::grid_dependency_wait();", params, 128, 0, None)


def early_launches(monkeypatch, plan: EmittedPlan) -> dict[str, bool]:
    fake_gpu(monkeypatch, runtime, driver)
    monkeypatch.setattr(driver, "overlaps_launches", lambda d: True)
    early: dict[str, bool] = {}
    monkeypatch.setattr(driver, "launch_function", lambda fn, grid, threads, smem, stream, args, name, e=False:
                        early.__setitem__(name, e))
    CompiledModel(two_output_model(), plan)(**arrays())
    return early


def test_a_launch_after_an_event_recorded_on_its_lane_is_not_early(monkeypatch):
    # k1 follows k0 on lane 0, but k0's event (which k2 on lane 1 waits for) is recorded between them
    plan = EmittedPlan((CudaKernel("k0", "", (ptr("A"), ptr("T", True)), 128, 0, None),
                        waiting("k1", ptr("T"), ptr("C", True)), waiting("k2", ptr("T"), ptr("D", True))),
                       (("T", "f32", ("M", "N")),), 2)
    assert early_launches(monkeypatch, plan) == {}  # k1 and k2 (after an event wait) by the plain launch


def test_a_launch_right_after_its_lanes_kernel_is_early(monkeypatch):
    plan = EmittedPlan((CudaKernel("k0", "", (ptr("A"), ptr("T", True)), 128, 0, None),
                        waiting("k1", ptr("T"), ptr("C", True)), waiting("k2", ptr("B"), ptr("D", True))),
                       (("T", "f32", ("M", "N")),), 2)
    assert early_launches(monkeypatch, plan) == {"k1": True}


def test_a_side_launch_waits_for_the_event_recorded_after_the_launch_it_reads(monkeypatch):
    # k1 (lane 0) follows k0; k2 reads k0's T on lane 1: the side stream waits for the event recorded after k0
    cuda = fake_gpu(monkeypatch, runtime, driver)
    plan = EmittedPlan((CudaKernel("k0", "", (ptr("A"), ptr("T", True)), 128, 0, None),
                        CudaKernel("k1", "", (ptr("T"), ptr("C", True)), 128, 0, None),
                        CudaKernel("k2", "", (ptr("T"), ptr("D", True)), 128, 0, None)),
                       (("T", "f32", ("M", "N")),), 2)
    CompiledModel(two_output_model(), plan)(**arrays())
    calls = [c for c in cuda.calls if c[0] in ("launch", "record", "wait")]
    k0 = next(i for i, c in enumerate(calls) if c[0] == "launch" and c[1] == "k0")
    k2 = next(i for i, c in enumerate(calls) if c[0] == "launch" and c[1] == "k2")
    after_k0 = calls[k0 + 1]
    assert after_k0[0] == "record" and after_k0[2] == ("stream", 0)
    waits = [c for c in calls[k0 + 1:k2] if c[0] == "wait" and c[1] == ("stream", 0x5EED)]
    assert [w[2] for w in waits] == [after_k0[1]]
