"""Without a GPU, ptxas's report is the only sign of a slow kernel: a search without one compiles each
candidate that would replace its best and refuses one that spills or whose wgmma ptxas serialized."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from habu.db import PlanDB
from habu.plan.plan import Plan
from habu.search import tasks
from habu.search.loop import Budget, Search
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
needs_compiler = pytest.mark.skipif(not tasks.compiles_here("sm_90a"), reason="no NVRTC or nvcc on this machine")


def gemm_job(size: int):
    m = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    sizes = {"M": size, "N": size, "K": size}
    m = m.with_sizes(sizes)
    return m, sizes, tasks.Job.of(str(ROOT / "examples" / "gemm.habu"), m, sizes, "sm_90a")


@needs_compiler
def test_a_proven_plan_ptxas_spills_is_slow_where_no_gpu_times_it(monkeypatch):
    """A 128×96 wgmma tile with one consumer warpgroup and cp.async operands (a legal plan of the
    emitted-CUDA snapshot's sample): ptxas spills 112 B. Proven either way; refused only when the
    search asks for a clean compile."""
    monkeypatch.setattr(tasks, "FIELD_CHECKS", {})
    m, sizes, job = gemm_job(512)
    base = default_plan(m, T, sizes, {})
    as_json = base.to_json()
    as_json["kernels"][0] |= {"tile_m": 128, "tile_n": 96, "tile_k": 64, "warps": 8, "stages": 3, "a_move": "cp.async",
                              "b_move": "cp.async", "raster": "column", "group_m": 1, "persistent": False,
                              "warp_specialized": True, "cluster_m": 1, "store": "direct"}
    plan = Plan.from_json(as_json)
    assert tasks.check_candidate(job, plan.to_json(), seed=1)["status"] == "verified"
    out = tasks.check_candidate(job, plan.to_json(), seed=2, clean_only=True)
    assert out["status"] == "slow", out
    assert re.fullmatch(r"habu_gemm_\w+_k0: ptxas: \d+ registers, \d+ B spilled, .*", out["reason"]), out["reason"]
    assert out["certificate"]["passed"] and "compile" in out["seconds"]
    # the default plan compiles clean: kept
    assert tasks.check_candidate(job, base.to_json(), seed=3, clean_only=True)["status"] == "verified"


def test_only_the_kernels_a_candidate_changes_are_judged():
    """A region's candidate is judged by its own kernels' reports (another region's best may spill
    whatever this one does), named by the entry function ptxas reported on; staging kernels count
    for the kernel they feed."""
    from habu.emit_cuda.nvrtc import Cubin, Resources

    def cubin(name: str, spills: int = 0, serialized: bool = False) -> tuple[str, Cubin]:
        log = f"ptxas info    : Compiling entry function '{name}' for 'sm_90a'\n"
        return name, Cubin(b"", "sm_90a", log, Resources(registers=168, spill_stores=spills,
                                                       wgmma_serialized=serialized), "nvrtc")

    cubins = [cubin("habu_m_0123abcd_k0", spills=24), cubin("habu_m_0123abcd_k1_stage0"),
              cubin("habu_m_0123abcd_k1", serialized=True)]
    assert tasks.slow_kernels(cubins, (2,)) == []
    assert tasks.slow_kernels(cubins, (0,)) == [
        "habu_m_0123abcd_k0: ptxas: 168 registers, 24 B spilled, 0 B static smem"]
    assert tasks.slow_kernels(cubins, (1,)) == [
        "habu_m_0123abcd_k1: ptxas: 168 registers, 0 spills, 0 B static smem, wgmma serialized by ptxas"]
    assert len(tasks.slow_kernels(cubins)) == 2
    # a spill counts only in a kernel with a main loop of accumulators (a row kernel's was measured harmless)
    assert tasks.slow_kernels(cubins, None, {1}) == [
        "habu_m_0123abcd_k1: ptxas: 168 registers, 0 spills, 0 B static smem, wgmma serialized by ptxas"]


@needs_compiler
def test_a_row_kernel_that_spills_a_little_is_not_refused(monkeypatch):
    """Softmax backward at 8192 × 16384: its default row kernel (256 threads, two blocks an SM) spills
    96 B and runs at 96% of copy bandwidth (docs/PERF.md), the fastest variant measured: kept."""
    from habu.spec.grad_program import with_backward

    monkeypatch.setattr(tasks, "FIELD_CHECKS", {})
    name = "SOFTMAX-ROWS-GRAD"
    m = with_backward(load_program(ROOT / "examples" / "softmax.habu"), name).models[name]
    job = tasks.Job.of(str(ROOT / "examples" / "softmax.habu"), m, {}, "sm_90a")
    plan = default_plan(m, T, {}, {})
    assert plan.kernels[0].kind == "rows"
    cubins = tasks.compile_plan(m, plan)
    assert cubins[0][1].resources.spills  # else this test no longer tests anything
    assert tasks.check_candidate(job, plan.to_json(), seed=1, clean_only=True)["status"] == "verified"


def search(tmp: Path, budget: Budget):
    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    sizes = {"M": 512, "N": 512, "K": 384}
    m = m.with_sizes(sizes)
    with PlanDB(tmp / "plans.sqlite") as db:
        result = Search(str(ROOT / "examples" / "ggemm.habu"), m, T, sizes, db, budget).run()
        return result, [r.plan for r in db.get(result.key).records], default_plan(m, T, sizes, {})


@needs_compiler
def test_a_search_without_a_gpu_stores_no_candidate_ptxas_reports_slow(monkeypatch):
    """The wiring: every compiled candidate reported slow. The search then keeps its first plan
    (the default, kept whatever its report) as its best and says how many it refused and why;
    without the report it finds a faster-predicted plan."""
    found, _, default = search(Path(tempfile.mkdtemp()), Budget(trials=6))
    assert found.best is not None and found.best.key != default.key and found.stats.refused_slow == 0

    asked: list[bool] = []
    real = tasks.check_candidate

    def recording(job, plan_json, seed, only=None, compile_kernels=False, deadline=None, clean_only=False):
        asked.append(clean_only)
        return real(job, plan_json, seed, only, compile_kernels, deadline, clean_only)

    monkeypatch.setattr("habu.search.pool.check_candidate", recording)
    monkeypatch.setattr(tasks, "slow_kernels", lambda *args: ["kernel 0: ptxas: 1 registers, 8 B spilled"])
    refused, plans, default = search(Path(tempfile.mkdtemp()), Budget(trials=6))
    assert refused.best is not None and refused.best.key == default.key
    assert Plan.from_json(plans[0]).key == default.key and found.best.to_json() not in plans
    assert refused.stats.refused_slow >= 1 and refused.stats.last_slow == "kernel 0: ptxas: 1 registers, 8 B spilled"
    # the default is not compiled; a candidate is when it is predicted faster than the best (the
    # runners-up stored under it, predicted slower, are not)
    assert asked[0] is False and sum(asked) == refused.stats.refused_slow, asked
