"""Emission on the CPU: every example's default plan and a seeded sample of 200+ legal plans from
the enumerator compile with NVRTC for sm_90a and sm_80, without spills where registers allow."""

from __future__ import annotations

import pytest

from habu.emit_cuda.nvrtc import compile_cuda
from habu.paths.emit import emit_plan
from habu.prove.rules import failures, obligations
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import EXAMPLES

ARCHS = ("sm_90a", "sm_80")


def runtime_sizes(model):
    return {e.name: 4096 for e in model.extents if not e.is_static} or None


@pytest.mark.parametrize("arch", ARCHS)
def test_default_plan_of_every_example_compiles(arch):
    """Every example's default plan breaks no rule, and each kernel compiles without spills and without ptxas
    serializing its wgmma (C7512: session 38's short prefill) (the compiles run on every core: NVRTC releases
    the GIL)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    jobs = []
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        for path in EXAMPLES:
            for model in load_program(path).models.values():
                sizes = runtime_sizes(model)
                plan = default_plan(model, TARGETS[arch], sizes)
                assert not failures(obligations(model, plan, sizes)), (path.name, model.name)
                for kernel in emit_plan(model, plan, TARGETS[arch]).kernels:
                    jobs.append((path.name, kernel.name, pool.submit(compile_cuda, kernel.source, kernel.name, arch)))
        for example, name, job in jobs:
            res = job.result().resources
            assert res.registers > 0 and not res.spills and not res.wgmma_serialized, (example, name, res.describe())


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_regression_a_plans_kernels_compile_as_one_translation_unit(path):
    """`habu compile` writes a plan's kernels into one plan.cu: FFN-SKIP's two wgmma kernels each
    defined the same m64n128 helper, and NVRTC refused the file ('has already been defined')."""
    from habu.emit_cuda.nvrtc import resources_of

    for model in load_program(path).models.values():
        sizes = runtime_sizes(model)
        plan = default_plan(model, TARGETS["sm_90a"], sizes)
        # the text `habu compile` writes (habu.compile.cuda_source joins the kernels of the proven plan;
        # the proof itself is tested elsewhere, and at these sizes costs minutes for the MoE examples)
        kernels = list(emit_plan(model, plan, TARGETS["sm_90a"]).kernels)
        source = "\n".join(k.source for k in kernels)
        cubin = compile_cuda(source, f"habu_{model.name.lower()}", "sm_90a")
        for k in kernels:
            assert resources_of(cubin.log, k.name).registers > 0, (model.name, k.name)


def test_a_seeded_sample_of_legal_plans_compiles_for_sm90a_and_sm80():
    """The seeded sample of legal plans the emitted-source snapshot records (tests/emit_cuda/emitted_snapshot.py
    draws it once, every plan passing the rules; the snapshot test checks all of their text), one plan of
    each code path compiled with NVRTC: every (arch, and per kernel kind, mma, movements, store) the sample
    holds (81 of 234 plans). All 234 took over ten minutes of NVRTC, a third of CI's time."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    from tests.emit_cuda.emitted_snapshot import recorded_plans

    sample = [(model, plan, arch) for _, model, plan, arch in recorded_plans()]
    assert len(sample) >= 200, len(sample)

    def path_of(plan, arch) -> tuple:
        return (arch, *((k.kind, getattr(k, "mma", ""), getattr(k, "a_move", ""), getattr(k, "b_move", ""),
                         str(getattr(k, "store", ""))) for k in plan.kernels))

    chosen: dict[tuple, tuple] = {}
    for model, plan, arch in sample:
        chosen.setdefault(path_of(plan, arch), (model, plan, arch))
    # NVRTC releases the GIL: the compiles run on every core (the emitting stays on this thread)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        compiles = [pool.submit(compile_cuda, kernel.source, kernel.name, arch)
                    for model, plan, arch in chosen.values()
                    for kernel in emit_plan(model, plan, TARGETS[arch]).kernels]  # staging passes add kernels
        for done in compiles:
            done.result()  # a CompileError fails the test, naming the kernel
    kinds = {(k.kind, getattr(k, "mma", "")) for _m, plan, _a in chosen.values() for k in plan.kernels}
    assert {("contraction", "wgmma"), ("contraction", "mma.sync"), ("contraction", "fma"), ("rows", ""),
            ("map", "")} <= kinds, kinds


def test_gather4_compiles_for_sm100a():
    model = load_program(EXAMPLES[[p.name for p in EXAMPLES].index("ggemm.habu")]).models["GGEMM"]
    plan = default_plan(model, TARGETS["sm_100a"], None, {"A": "tma"})
    assert plan.kernels[0].a_move == "tma-gather4"
    (kernel,) = emit_plan(model, plan, TARGETS["sm_100a"]).kernels
    assert "habu::tma_gather4" in kernel.source
    cubin = compile_cuda(kernel.source, kernel.name, "sm_100a")
    assert cubin.resources.registers > 0


@pytest.mark.parametrize("pins, early", [({}, False), ({"rewrite": "factor:Y"}, True)],
                         ids=["normalised-x-read-by-the-main-loop", "scale-read-by-the-epilogue"])
def test_a_plans_kernels_wait_for_the_previous_one_before_touching_its_output(pins, early):
    """Programmatic dependent launch: every kernel lets the next begin launching and waits for the
    previous one before it reads what that one wrote. The contraction starts its main loop early only
    when no earlier kernel writes what the main loop reads (factor:Y: X and W; the scale is read in the
    epilogue, after the consumers' wait)."""
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / "rmsnorm_linear.habu").models["RMSNORM-LINEAR"]
    target = TARGETS["sm_90a"]
    plan = default_plan(m, target, None, pins)
    rows, gemm = emit_plan(m, plan, target).kernels
    for k in (rows, gemm):
        assert k.waits_for_previous and "habu::grid_dependency_launch();" in k.source
    body = rows.source[rows.source.index("__global__"):]
    assert body.index("grid_dependency_wait") < body.index("(p_X + ")
    body = gemm.source[gemm.source.index("__global__"):]
    wait = body.index("habu::grid_dependency_wait();")
    if early:
        assert body.count("habu::grid_dependency_wait();") == 1
        assert body.index("----- consumers") < body.index("wgmma_wait<0>") < wait < body.index("tma_store_2d")
    else:
        assert wait < body.index("if (wg == 0)")
    compile_cuda(gemm.source, gemm.name, "sm_90a")


@pytest.mark.parametrize("path,model,pins", [("ggemm.habu", "GGEMM", {"store": "tma", "persistent": "true"}),
                                             ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"store": "tma"}),
                                             ("gemm.habu", "GEMM", {"store": "tma", "tile": "256x128x64",
                                                                    "warps": "12", "stages": "3"})])
def test_tma_store_epilogue_compiles_and_drains_before_the_block_exits(path, model, pins):
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / path).models[model]
    target = TARGETS["sm_90a"]
    plan = default_plan(m, target, None, pins)
    assert not failures(obligations(m, plan))
    (k,) = [k for k in emit_plan(m, plan, target).kernels if k.lowering.__class__.__name__ == "ContractionLowering"]
    assert k.source.count("habu::tma_store_2d(") == 1 and "habu::bulk_wait_group<0>()" in k.source
    assert any(p.kind == "tensormap" and p.tensor == m.outputs[0].name for p in k.params)
    compile_cuda(k.source, k.name, "sm_90a")


@pytest.mark.parametrize("path,model,pins", [
    ("ggemm.habu", "GGEMM", {"cluster": "2", "tile": "128x256x64", "stages": "3", "persistent": "true"}),
    ("gemm.habu", "GEMM", {"cluster": "2", "tile": "128x128x64", "stages": "4", "store": "direct"})])
def test_a_cluster_kernel_multicasts_b_and_frees_a_stage_in_every_block(path, model, pins):
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / path).models[model]
    target = TARGETS["sm_90a"]
    plan = default_plan(m, target, None, pins)
    assert not failures(obligations(m, plan))
    (k,) = emit_plan(m, plan, target).kernels
    assert k.cluster == 2 and "__cluster_dims__(2, 1, 1)" in k.source
    assert k.source.count("habu::tma_load_2d_multicast(") == 1  # B's part; A (gathered or not) stays local
    assert "habu::mbar_arrive_cluster(" in k.source and k.source.count("habu::cluster_sync();") == 2
    consumers = k.threads // 128 - 1
    # the empty barriers count every consumer warpgroup of the cluster (the ring's empty_arrivals)
    ring = k.lowering.pipeline
    assert ring.empty_arrivals == 2 * consumers
    assert f"habu::ring_init(bars, {ring.stages}, {ring.full_arrivals}, {2 * consumers});" in k.source
    compile_cuda(k.source, k.name, "sm_90a")


def test_a_cluster_kernel_with_an_n_major_b_multicasts_alternate_boxes(tmp_path):
    from tests.conftest import gemm_kn_source

    path = tmp_path / "gemm_kn.habu"
    path.write_text(gemm_kn_source())
    m = load_program(path).models["GEMM-KN"]
    target = TARGETS["sm_90a"]
    plan = default_plan(m, target, None, {"cluster": "2", "tile": "128x256x64", "stages": "3", "B": "tma",
                                           "mma": "wgmma"})
    assert not failures(obligations(m, plan))
    (k,) = [k for k in emit_plan(m, plan, target).kernels if k.cluster == 2]  # after any staging pass
    assert "j += 2) habu::tma_load_2d_multicast(" in k.source
    compile_cuda(k.source, k.name, "sm_90a")


def test_the_emitter_refuses_a_proof_that_failed_and_prints_from_the_proven_lowering():
    """emit(proof) prints from the lowering the proof's rules and finite-field check read; a plan
    whose proof failed (a rule, or the finite-field check) is not emitted."""
    from dataclasses import replace

    from habu.errors import HabuError
    from habu.paths.emit import emit
    from habu.prove import prove
    from tests.conftest import ROOT

    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    target = TARGETS["sm_90a"]
    plan = default_plan(m, target, None)
    proof = prove(m, plan, None, trials=1)
    assert proof.ok and proof.lowered is not None and proof.lowered.plan == plan
    assert [k.source for k in emit(proof, target).kernels] == [k.source for k in emit_plan(m, plan, target).kernels]
    with pytest.raises(HabuError, match="refusing to emit"):
        emit(replace(proof, certificate=replace(proof.certificate, passed=False, failure="planted")), target)
    with pytest.raises(HabuError, match="not checked over the finite field"):
        emit(replace(proof, certificate=None), target)
    other = replace(plan, kernels=(replace(plan.kernels[0], tile_k=plan.kernels[0].tile_k * 2),))
    with pytest.raises(HabuError, match="not the ones proven"):
        emit(replace(proof, plan=other), target)


@pytest.mark.parametrize(("k", "mma", "vector", "copy"), [
    (512, "mma.sync", None, "habu::cp_async<16>(s_a"),  # 8-element vectors of the staged rows
    (511, "mma.sync", None, "habu::cp_async<16>(s_a"),  # ... at any K: the pass writes zeros into the padding
    (510, "mma.sync", "2", "habu::cp_async<4>(s_a"),  # pairs, pinned
    (511, "mma.sync", "1", "habu::load2_or_zero"),  # an element at a time, pinned
    (511, "fma", None, "p_staged_A + "),
])
def test_a_staged_operand_is_read_from_its_buffer_as_its_lowering_moves_it(k, mma, vector, copy):
    """The mma.sync and SIMT main loops read a staged A's buffer (`@A`, rows 16 bytes apart) by cp.async of the
    lowering's vector, or an element at a time (`habu.lower.staging.main_loop_move`, session 69): the emitter prints
    the movement the lowering's copy map has, so a vector of 8 is one 16-byte cp.async, never 2-byte loads. A pinned
    staged operand on mma.sync takes 16-byte vectors unless a vector is pinned too (session 70)."""
    ggemm = EXAMPLES[[p.name for p in EXAMPLES].index("ggemm.habu")]
    model = load_program(ggemm).models["GGEMM"].with_sizes({"M": 300, "N": 200, "K": k})
    pins = {"mma": mma, "A": "staged", **({"vector": vector} if vector else {})}
    plan = default_plan(model, TARGETS["sm_90a"], {}, pins)
    assert not failures(obligations(model, plan))
    main = emit_plan(model, plan, TARGETS["sm_90a"]).kernels[-1].source  # after the staging pass
    loads = [line for line in main.splitlines() if "(p_staged_A +" in line or "p_staged_A[" in line]
    assert loads and all(copy in line for line in loads), loads[:2]
