"""Kernel paths are plug-ins (habu/paths/): one registry that the rules, emission, the search space
and the cost model ask; a toy path registered here alone is asked by all of them with nothing else
edited (docs/ARCHITECTURE.md, "Adding a kernel path")."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import replace

import pytest

from habu.emit_cuda.emit_wgmma import wgmma_layout
from habu.emit_cuda.kernel import CudaKernel
from habu.lower import lower_plan
from habu.lower.registers import warp_specialized_split
from habu.lower.rows import MapLowering
from habu.lower.support import (
    SUPPORT,
    MapSupport,
    MmaSyncSupport,
    contraction_smem,
    kernel_consumer_warpgroups,
    support_for,
)
from habu.paths import PATHS, by_preference, path_for, register, unregister
from habu.paths.contraction import ContractionFacts, Shape
from habu.paths.emit import emit_plan
from habu.paths.map import MapPath
from habu.paths.mma_sync import MmaSyncPath
from habu.plan.patterns import default_regions
from habu.plan.plan import ContractionKernel, Kernel, MapKernel
from habu.prove.rules import failures, obligations
from habu.search.cost import plan_cost
from habu.search.space import default_plan, enumerate_plans, region_space
from habu.spec.ir import Model
from habu.spec.parser import load_program
from habu.target import TARGETS, Target
from habu.targets import register as register_target
from habu.targets import unregister as unregister_target
from tests.conftest import EXAMPLES, ROOT


def _models() -> Iterator[Model]:
    for path in EXAMPLES:
        yield from load_program(path).models.values()


def _sizes(model: Model) -> dict[str, int] | None:
    return {e.name: 4096 for e in model.extents if not e.is_static} or None


def test_every_default_kernel_has_one_path_and_the_rules_ask_the_same_one():
    for model in _models():
        for arch, target in TARGETS.items():
            for k in default_plan(model, target, _sizes(model)).kernels:
                path = path_for(k)
                assert path.name == (k.mma if isinstance(k, ContractionKernel) else k.kind), (model.name, arch)
                assert support_for(k) is path.support
    assert [p.name for p in PATHS] == ["fma", "mma.sync", "wgmma", "rows", "map", "columns", "grouped", "attention",
                                      "general"]
    assert [s.name for s in SUPPORT] == [p.name for p in PATHS]


# ----------------------------------------------------------------------------- a toy path


class ToyMapSupport(MapSupport):
    name = "toy-map"

    def refusals(self, lw: MapLowering) -> list[str]:
        return ["the toy path prints one element per thread"] if lw.kernel.vector > 1 else []


class ToyMapPath(MapPath):
    """The map path under another name: fewer variants, one element per thread, its source marked."""

    support = ToyMapSupport()

    def variants(self, base: Kernel, target: Target, row_length: int | None = None) -> Iterator[Kernel]:
        assert isinstance(base, MapKernel)
        for threads in (128, 512):
            yield replace(base, threads=threads, vector=1)

    def emit(self, name, model, lowering, static, target, early_main_loop=False) -> CudaKernel:
        kernel = super().emit(name, model, lowering, static, target)
        return dataclasses.replace(kernel, source="// printed by the toy map path\n" + kernel.source)


@pytest.fixture
def toy_path():
    """The toy path registered for one test (asked before the built-in map path)."""
    register(ToyMapPath())
    yield
    unregister("toy-map")


AXPY = load_program(ROOT / "examples" / "fused.habu").models["AXPY-RELU"]


def test_a_toy_path_is_asked_by_the_rules_the_search_emission_and_the_cost_model(toy_path):
    target = TARGETS["sm_90a"]
    plan = default_plan(AXPY, target)
    (k,) = plan.kernels
    assert path_for(k).name == "toy-map" and support_for(k).name == "toy-map"
    # the rules: the toy's supported-path obligation, its refusal
    (ob,) = [o for o in obligations(AXPY, plan) if o.rule.name == "supported-path"]
    assert ob.statement == "the toy-map path supports this plan"
    assert k.vector > 1 and ob.status == "violated" and "one element per thread" in ob.detail
    plan1 = replace(plan, kernels=(replace(k, vector=1),))
    assert not failures(obligations(AXPY, plan1))
    # the search space: the toy's variants
    (region,) = default_regions(AXPY)
    s = {e.name: e.size for e in AXPY.extents}
    assert [(v.threads, v.vector) for v in region_space(AXPY, region, target, s)] == [(128, 1), (512, 1)]
    assert len(list(enumerate_plans(AXPY, target))) == 3  # the default, then the two variants
    # emission through the toy's emit, the cost model by its family
    (kernel,) = emit_plan(AXPY, plan1, target).kernels
    assert kernel.source.startswith("// printed by the toy map path")
    (cost,) = plan_cost(AXPY, plan1, target)
    assert cost.bound == "memory"


def test_unregistering_the_toy_restores_the_built_in_map_path(toy_path):
    unregister("toy-map")
    (k,) = default_plan(AXPY, TARGETS["sm_90a"]).kernels
    assert path_for(k).name == support_for(k).name == "map"
    register(ToyMapPath())  # the fixture removes it again


# ----------------------------------------------------------------------------- one consumer count


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_wgmma_consumer_warpgroups_are_counted_once_for_rules_smem_registers_and_emitter():
    model = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    target = TARGETS["sm_90a"]
    seen = set()
    for plan in enumerate_plans(model, target):
        (k,) = plan.kernels
        if k.mma != "wgmma" or k.store != "tma" or k.warps in seen or failures(obligations(model, plan)):
            continue
        seen.add(k.warps)
        (lw,) = lower_plan(model, plan)
        count = kernel_consumer_warpgroups(k)
        assert wgmma_layout(lw)[0] == count == warp_specialized_split(k.warps).consumers
        boxes = [b for b in contraction_smem(k, lw.a.dtype, lw.b.dtype).buffers if b.name.startswith("E")]
        assert len(boxes) == 2 * count
        if len(seen) == 2:
            break
    assert len(seen) == 2  # one and two consumer warpgroups


def test_regression_mma_sync_swizzle_is_refused_by_the_rules_as_the_emitter_refuses_it():
    """A pinned swizzle on an mma.sync plan passed every rule, then the emitter raised ValueError
    (its own list of what it prints): now the path's refusals are the rule and the emitter's check."""
    model = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    target = TARGETS["sm_80"]
    plan = default_plan(model, target)
    (k,) = plan.kernels
    assert k.mma == "mma.sync" and not failures(obligations(model, plan))
    bad = replace(plan, kernels=(replace(k, swizzle=64),))
    (ob,) = failures(obligations(model, bad))
    assert ob.rule.name == "supported-path" and "swizzle 0" in ob.detail
    with pytest.raises(ValueError, match="swizzle 0"):
        emit_plan(model, bad, target)


def test_a_path_states_the_same_supported_path_obligation_as_the_rules():
    from habu.prove.obligation import context

    model = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    target = TARGETS["sm_90a"]
    plan = default_plan(model, target)
    bad = replace(plan, kernels=(replace(plan.kernels[0], cluster_m=2, split_k=2),))
    for p in (plan, bad):
        (k,) = p.kernels
        (lw,) = lower_plan(model, p)
        (mine,) = path_for(k).supported("kernel 0", lw, context(model, p))
        (rules,) = [o for o in obligations(model, p) if o.rule.name == "supported-path"]
        assert (mine.statement, mine.detail) == (rules.statement, rules.detail)
    assert "clusters and split-K are not emitted together" in rules.detail


# ----------------------------------------------------------------------------- a toy path on a toy target


class ToyMmaSupport(MmaSyncSupport):
    name = "toy-mma"


class ToyMmaPath(MmaSyncPath):
    """mma.sync under another name that owns its own analytic default and search tables, and takes
    contractions only on the toy target (asked before mma.sync, after wgmma)."""

    support = ToyMmaSupport()
    preference = 25

    def takes(self, facts: ContractionFacts, target: Target) -> bool:
        return target.name == "sm_toy" and super().takes(facts, target)

    def default_schedule(self, m: int, n: int, target: Target, k: int = 0) -> tuple[tuple[int, int, int], int, int]:
        return (64, 64, 32), 4, 2

    def shapes(self) -> list[Shape]:
        return [(64, 64, 32, 4, 2), (64, 64, 64, 4, 3)]


@pytest.fixture
def toy_path_and_target():
    """The toy path and a toy target (sm_80 under another name), registered for one test only."""
    target = register_target(dataclasses.replace(TARGETS["sm_80"], name="sm_toy", description="a toy sm_80"))
    register(ToyMmaPath())
    yield target
    unregister("toy-mma")
    unregister_target("sm_toy")


def test_a_toy_path_and_a_toy_target_are_picked_up_with_no_other_edit(toy_path_and_target):
    """docs/ARCHITECTURE.md's measurement: one path object and one target registered, nothing else
    edited; the analytic default, the search space and the rules all ask them."""
    toy, sm_80 = toy_path_and_target, TARGETS["sm_80"]
    model = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    # the analytic default: the toy's own schedule on the toy target, mma.sync's elsewhere
    plan = default_plan(model, toy)
    (k,) = plan.kernels
    assert (k.mma, k.tile_m, k.tile_n, k.tile_k, k.warps, k.stages) == ("mma.sync", 64, 64, 32, 4, 2)
    assert [p.name for p in by_preference("contraction")] == ["wgmma", "toy-mma", "mma.sync", "fma"]
    (k80,) = default_plan(model, sm_80).kernels
    assert (k80.tile_m, k80.tile_n) == (128, 128)
    # the rules: the toy's supported-path obligation, and the toy target's rules prove the plan
    assert path_for(k).name == support_for(k).name == "toy-mma"
    obs = obligations(model, plan)
    assert not failures(obs)
    (ob,) = [o for o in obs if o.rule.name == "supported-path"]
    assert ob.statement == "the toy-mma path supports this plan"
    # the search space: the toy's shape table for its instruction on the toy target
    (region,) = default_regions(model)
    sizes = {e.name: e.size for e in model.extents}
    space = list(region_space(model, region, toy, sizes))
    assert {(v.tile_m, v.tile_n, v.tile_k) for v in space if v.mma == "mma.sync"} == {(64, 64, 32), (64, 64, 64)}
    assert any(v.mma == "fma" for v in space)


def test_unregistering_the_toy_path_gives_the_toy_target_mma_syncs_default(toy_path_and_target):
    model = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"]
    unregister("toy-mma")
    (k,) = default_plan(model, toy_path_and_target).kernels
    assert path_for(k).name == "mma.sync" and (k.tile_m, k.tile_n) == (128, 128)
    register(ToyMmaPath())  # the fixture removes it again


def test_regression_a_batch_shared_mn_major_operand_takes_wgmma_through_tma_boxes():
    """Session 63: attention's dQ = Σ j dS·K, K[b g j e] shared by the query heads r and MN-major, ran on mma.sync:
    the wgmma path's facts asked an MN-major operand for every batch axis of the product (`_batch_read`). The
    default is now wgmma with B moved by TMA, and proven (the exact GPU check: tests/gpu/test_epilogue_conditions_gpu.py)."""
    from habu.prove import prove
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    model = load_program(ROOT / "tests" / "data" / "shared_batch_operand.habu").models["SHARED-MN"]
    plan = default_plan(model, TARGETS["sm_90a"], {}, {})
    (kernel,) = plan.kernels
    assert kernel.mma == "wgmma" and kernel.b_move == "tma", kernel
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [v.describe() for v in proof.violations] or proof.certificate.failure
