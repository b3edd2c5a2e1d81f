"""The consumer lag (`consumer_lag`, `MbarrierRing.lag`): a wgmma kernel's second consumer warpgroup starts a tile's
k loop once the first has multiplied `lag` k tiles, so their epilogues do not coincide. The ring simulator runs
the lag (a lag past the ring's stages deadlocks there), the emitter prints its barriers from the lowering, and a
pin takes it only where there are warpgroups to stagger."""

from __future__ import annotations

from dataclasses import replace

from habu.emit_cuda.nvrtc import _nvrtc, compile_cuda
from habu.lower import lower_plan
from habu.paths import path_for
from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.prove.pipeline import rule_steps, run_ring
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
SHAPE = {"B": 128, "D": 512, "H": 1024}
PINS = {"tile": "128x128x64", "lag": "2"}


def _backward():
    model = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP").model
    return model.with_sizes(SHAPE)


def test_a_lagged_plan_is_proven_and_prints_the_lowerings_barriers():
    model = _backward()
    plan = default_plan(model, T, {}, PINS)
    lagged = [k for k in plan.kernels if getattr(k, "consumer_lag", 0)]
    assert lagged and all(k.warps >= 12 and not k.persistent for k in lagged)
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    i = plan.kernels.index(lagged[0])
    ring = lower_plan(model, plan)[i].pipeline
    assert ring.lag == 2 and ring.lag_barrier(1) == 8
    kernel = emit_plan(model, plan, T).kernels[i]
    src = kernel.source
    assert "if (cw > 0) habu::named_barrier_sync(((8 + cw) - 1), 256);" in src
    assert "kt - kt_begin + 1 == lag_tiles) habu::named_barrier_arrive(((8 + (cw + 1)) - 1), 256);" in src
    if _nvrtc() is not None:
        res = compile_cuda(src, kernel.name, "sm_90a").resources
        assert not res.spills, res.describe()


def test_a_lag_past_the_rings_stages_deadlocks_in_the_simulator():
    model = _backward()
    plan = default_plan(model, T, {}, PINS)
    ring = next(lw.pipeline for lw in lower_plan(model, plan) if getattr(getattr(lw, "pipeline", None), "lag", 0))
    for lag in (1, ring.stages):
        assert not any(run.faults for steps in rule_steps(ring.stages) for run in run_ring(replace(ring, lag=lag), steps))
    runs = run_ring(replace(ring, lag=ring.stages + 1), (13,))
    assert all(run.faults and "deadlocks" in run.faults[0] for run in runs)


def test_a_persistent_lag_needs_tiles_longer_than_the_ring_and_one_consumer_has_none():
    """A persistent block meets its named barrier once a tile: the first warpgroup must not reach the next tile's
    arrival before the second has waited (n + min(n, lag) > stages k tiles, at every size of k)."""
    gemm = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    pins = {"lag": "2", "persistent": "true"}
    for k, ok in ((4096, True), (192, True), (64, False)):
        model = gemm.with_sizes({"M": 4096, "N": 4096, "K": k})
        plan = default_plan(model, T, {}, pins)
        assert plan.kernels[0].consumer_lag == (2 if ok else 0)  # the pin staggers only where it holds
        forced = replace(plan, kernels=(replace(plan.kernels[0], consumer_lag=2),))
        proof = prove(model, forced, {}, trials=1)
        assert proof.ok == ok, [o.detail for o in proof.violations]
        if not ok:
            assert {o.rule.name for o in proof.violations} == {"pipeline-schedule"}
    one = default_plan(_backward(), T, {}, {"tile": "64x64x64", "lag": "2"})  # one consumer warpgroup each
    assert not any(getattr(k, "consumer_lag", 0) for k in one.kernels)


def test_the_search_offers_a_lag_to_skinny_products_of_two_consumers():
    model = _backward()
    base = default_plan(model, T, {}, {"tile": "128x128x64"}).kernels[1]
    offered = [v for v in path_for(base).variants(base, T, skinny=True) if v.consumer_lag]
    assert offered and all(v.warps >= 12 and v.split_k == 1 and v.cluster_m == 1 for v in offered)


def test_regression_a_lag_barrier_on_an_epilogue_barrier_is_refused():
    """A planted ring whose lag waits on named barrier 1 (warpgroup 0's epilogue barrier): the two barriers' arrivals
    would mix and hang the block. supported-path refuses it, naming the barriers."""
    from habu.lower.support import support_for

    model = _backward()
    plan = default_plan(model, T, {}, PINS)
    i, lw = next((i, lw) for i, lw in enumerate(lower_plan(model, plan)) if getattr(getattr(lw, "pipeline", None), "lag", 0))
    assert not support_for(plan.kernels[i]).refusals(lw)
    planted = replace(lw, pipeline=replace(lw.pipeline, lag_barrier_base=1))
    assert any("named barriers [1]" in r for r in support_for(plan.kernels[i]).refusals(planted))
