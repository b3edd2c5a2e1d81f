"""`scatter:T` (habu/plan/scatter_split.py): GGEMM's backward dA, `dA[IX[m] k] += Σ n dO[m n]·B[n k]`, as a
plain contraction into an f32 intermediate and a scatter-add kernel, the plan torch's autograd runs (a GEMM,
then index_add_). Proven like any plan; chosen by the default where the cost model predicts it faster."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.lower import ContractionLowering, GeneralLowering, lower_plan
from habu.lower.general import Store
from habu.paths.emit import emit_plan
from habu.plan.patterns import default_regions
from habu.plan.rewrite import RewriteError, applicable, apply_rewrites
from habu.prove import prove
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
PATH = ROOT / "tests" / "data" / "ggemm_backward.habu"
SIZES = {"M": 200, "N": 136, "K": 72}  # ragged against every tile
PINS = {"rewrite": "scatter:dA"}


def _model(name: str = "GGEMM-DA", sizes: dict[str, int] = SIZES):
    return load_program(PATH).models[name].with_sizes(sizes)


@pytest.fixture(scope="module")
def plan():
    return default_plan(_model(), TARGET, SIZES, PINS)


def test_the_rewrite_makes_a_plain_product_in_f32_and_a_scatter_add(plan):
    model = _model()
    assert applicable(model) == ["scatter:dA"]
    graph = apply_rewrites(model, ("scatter:dA",))
    product, scatter = graph.nodes
    assert product.target == "dA.mm" and product.scatter is None and product.rhs == model.nodes[0].rhs
    assert scatter.target == "dA" and scatter.scatter == model.nodes[0].scatter
    assert [r.kind for r in default_regions(graph)] == ["contraction", "general"]
    # f32 whatever the operands' type: the accumulator's values, added as the fused epilogue adds them
    assert plan.storage == (("dA.mm", "f32"),)
    da_mm, da = plan.kernels
    assert (da_mm.kind, da_mm.mma, da_mm.store) == ("contraction", "wgmma", "tma") and da.kind == "general"
    k0, k1 = lower_plan(model, plan)
    assert isinstance(k0, ContractionLowering) and k0.store is Store.WRITE and k0.out.dtype == "f32"
    assert isinstance(k1, GeneralLowering) and k1.store is Store.ATOMIC_ADD
    assert [(p.kind, p.table) for p in k1.out.positions] == [("gather", "IX"), ("axis", "")]
    emitted = emit_plan(model, plan, TARGET)
    assert "atomicAdd(p_dA + ((int)((int)p_IX[e0])" in emitted.kernels[1].source
    assert not any(k.zero for k in emitted.kernels)  # dA keeps its prior contents


def test_the_rewritten_plan_is_proven_at_ragged_shapes(plan):
    proof = prove(_model(), plan, SIZES, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]


def test_a_plain_store_in_the_scatter_kernel_is_killed_and_refused(plan):
    """Duplicates in IX overwrite each other: the field check (on the witness shape, IX with repeats) kills it."""
    k0, k1 = lower_plan(_model(), plan)
    cert = verify_plan(_model(), plan, SIZES, trials=1, seeds=[3], lowerings=[k0, replace(k1, store=Store.WRITE)])
    assert not cert.passed and "dA" in (cert.failure or ""), cert.failure
    ungathered = replace(k1.out, positions=tuple(replace(p, kind="axis", table="") if p.kind == "gather" else p
                                                 for p in k1.out.positions), checks=())
    cert = verify_plan(_model(), plan, SIZES, trials=1, seeds=[3], lowerings=[k0, replace(k1, out=ungathered)])
    assert not cert.passed


def test_the_default_takes_it_where_the_cost_model_predicts_it_faster():
    """4096³: the scatter epilogue's reductions into a 64 MB dA (past the L2) cost more than storing the
    product and a scatter kernel; 1024³: dA fits in the L2, the fused epilogue stays. A family or rewrite
    pin decides instead (the bench pins both)."""
    big = {"M": 4096, "N": 4096, "K": 4096}
    model = _model(sizes=big)
    assert default_plan(model, TARGET, big).rewrites == ("scatter:dA",)
    fused = default_plan(model, TARGET, big, {"family": "contraction"})
    assert fused.rewrites == () and [k.kind for k in fused.kernels] == ["contraction"]
    small = {"M": 1024, "N": 1024, "K": 1024}
    assert default_plan(_model(sizes=small), TARGET, small).rewrites == ()
    # no wgmma: the node stays a general kernel (a loop over n per element), and no rewrite is taken
    assert default_plan(model, TARGETS["sm_80"], big).rewrites == ()
    # f32 operands (the SIMT path's scatter epilogue): not measured against the split, not taken
    assert default_plan(_model("GGEMM-DA-F32", big), TARGET, big).rewrites == ()


def test_the_rewrite_applies_to_a_scatter_add_of_a_contraction_only():
    program = parse_text(PATH.read_text() + "MODEL: COPY  dA[IX[m] k] += dG[m k] ;\n")
    assert applicable(program.models["GGEMM-DA-F32"]) == ["scatter:dA"]
    for name in ("GGEMM-DB", "GGEMM-DG", "COPY"):  # a k-gathered operand, no scatter, no contraction
        assert not [r for r in applicable(program.models[name]) if r.startswith("scatter:")]
    with pytest.raises(RewriteError):
        apply_rewrites(program.models["GGEMM-DG"], ("scatter:dG",))


def test_regression_a_scatter_node_after_a_contraction_is_not_fused_into_its_epilogue():
    """`T.mm = Σ …` then `T[IX[m] k] += T.mm[m k]`: the greedy fusion took the scatter as the contraction's
    elementwise epilogue (a contraction region of both nodes), the scatter epilogue the rewrite undoes."""
    text = PATH.read_text() + "MODEL: TWO  P[m k] = Σ n dO[m n] · B[n k]  dA[IX[m] k] += P[m k] ;\n"
    model = parse_text(text).models["TWO"]
    assert [(r.kind, r.nodes) for r in default_regions(model)] == [("contraction", ("P",)), ("general", ("dA",))]


def test_the_scatter_kernel_with_several_elements_a_thread_is_proven_and_a_wrong_stride_killed():
    """`--pin elements=4`: thread x of block b adds elements (4b + v)·256 + x, v < 4 (four coalesced sweeps of
    the block, their loads in flight together); a thread map whose blocks tile fewer elements than the grid
    assumes leaves some unwritten."""
    from habu.lower.lanes import FlatThreads

    model = _model()
    plan = default_plan(model, TARGET, SIZES, {**PINS, "elements": "4"})
    assert plan.kernels[1].elements == 4
    proof = prove(model, plan, SIZES, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    k0, k1 = lower_plan(model, plan)
    assert k1.per_block == 1024 and k1.thread_map == FlatThreads(256, 4)
    (_, scatter) = emit_plan(model, plan, TARGET).kernels
    assert "const int e = (((int)blockIdx.x * 4) + v) * 256 + threadIdx.x;" in scatter.source
    cert = verify_plan(model, plan, SIZES, trials=1, seeds=[3], lowerings=[k0, replace(k1, thread_map=FlatThreads(256, 2))])
    assert not cert.passed


def test_a_large_general_kernel_without_loops_moves_vectors_and_several_elements_a_thread():
    """The scatter-add and the gathered copy at 4096³ (H200, exact: the copy 80.0 -> 37.4 µs with 8 elements
    a thread, 15.6 moving 16-byte vectors; the scatter 122.3 -> 94.3 -> 89.6 with 4-element vectors, its
    blocks from the last piece); the elements shrink to keep four blocks an SM; a small grid, or a kernel with
    a reduction loop, keeps one element a thread."""
    big = {"M": 4096, "N": 4096, "K": 4096}
    (scatter,) = [k for k in default_plan(_model(sizes=big), TARGET, big).kernels if k.kind == "general"]
    assert (scatter.elements, scatter.vector, scatter.reverse) == (8, 4, True)  # reads dA.mm, written last
    gathered = default_plan(_model("GGEMM-DB", big), TARGET, big, {"rewrite": "gather:dB"})
    assert (gathered.kernels[0].elements, gathered.kernels[0].vector, gathered.kernels[0].reverse) == (8, 8, False)
    small = {"M": 1024, "N": 1024, "K": 1024}  # 1024 blocks moving 4 f32 a thread: one element a sweep
    assert (default_plan(_model(sizes=small), TARGET, small, PINS).kernels[1].elements,
            default_plan(_model(sizes=small), TARGET, small, PINS).kernels[1].vector) == (1, 4)
    tiny = {"M": 200, "N": 136, "K": 264}  # 52 blocks even of one element a thread: nothing changes
    assert [(k.elements, k.vector) for k in default_plan(_model(sizes=tiny), TARGET, tiny, PINS).kernels
            if k.kind == "general"] == [(1, 1)]
    odd = {"M": 4096, "N": 4096, "K": 4094}  # rows of 4094: the widest vector dividing them is 2
    assert [(k.elements, k.vector) for k in default_plan(_model(sizes=odd), TARGET, odd, PINS).kernels
            if k.kind == "general"] == [(8, 2)]
    assert default_plan(_model(sizes=big), TARGET, big, {"family": "general"}).kernels[0].elements == 1  # (Σ n)


def test_the_scatter_kernel_moving_vectors_is_proven_and_refused_where_a_vector_would_cross_a_row():
    """`--pin vector=4`: each thread adds 4 consecutive elements of a row with one `red.global.add.v4.f32`
    (`habu::red_add_vec`), loading them with one 16-byte load; the guard is printed at the vector's first
    element, so #K must be a multiple of 4 (the `vector-align` rule), and the contract asks 16-byte bases."""
    from habu.emit_cuda.checks import contract_of
    from habu.lower.lanes import FlatThreads

    model = _model()  # K = 72
    plan = default_plan(model, TARGET, SIZES, {**PINS, "vector": "4", "elements": "2"})
    proof = prove(model, plan, SIZES, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    k0, k1 = lower_plan(model, plan)
    assert k1.per_block == 2048 and k1.thread_map == FlatThreads(256, 2, 4)
    emitted = emit_plan(model, plan, TARGET)
    scatter = emitted.kernels[1].source
    assert "const int e = ((((((int)blockIdx.x * 2) + v) * 256) + threadIdx.x) * 4);" in scatter
    assert "habu::load_vec<4>(p_dA_2e_mm + " in scatter and "habu::red_add_vec<4>(p_dA + " in scatter
    assert {t.name: t.align for t in contract_of(model, emitted).tensors}["dA"] == 16
    # a thread map without the vector factor leaves three quarters of dA unadded (the mutant
    # general-vector-factor-dropped in habu/bench/mutants.py plants it)
    cert = verify_plan(model, plan, SIZES, trials=1, seeds=[3], lowerings=[k0, replace(k1, thread_map=FlatThreads(256, 2))])
    assert not cert.passed
    ragged = {"M": 200, "N": 136, "K": 70}
    refused = prove(_model(sizes=ragged), default_plan(_model(sizes=ragged), TARGET, ragged, {**PINS, "vector": "4"}),
                    ragged, trials=1)
    assert not refused.ok and any(o.rule.name == "vector-align" and "#K is not a multiple of 4" in o.detail
                                  for o in refused.violations)
    wide = prove(model, default_plan(model, TARGET, SIZES, {**PINS, "vector": "8"}), SIZES, trials=1)
    assert any("more than 16 bytes" in o.detail for o in wide.violations)  # 8 f32: 32 bytes


def test_the_scatter_kernel_taking_its_pieces_from_the_last_is_proven_and_an_off_by_one_killed():
    """`--pin reverse=true`: block b adds the piece grid − 1 − b (the product's last-written rows first, while
    they may sit in the L2); the check runs the blocks the thread map assigns, so a piece grid − b (block 0
    past the end, piece 0 nobody's) leaves dA's first rows unadded."""
    from dataclasses import dataclass

    from habu.lower.lanes import FlatThreads

    model = _model()
    plan = default_plan(model, TARGET, SIZES, {**PINS, "vector": "4", "reverse": "true"})
    proof = prove(model, plan, SIZES, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    scatter = emit_plan(model, plan, TARGET).kernels[1].source
    assert "const int e = ((((((int)gridDim.x - 1) - (int)blockIdx.x) * 256) + threadIdx.x) * 4);" in scatter

    @dataclass(frozen=True)
    class OffByOne(FlatThreads):
        def piece(self, block, blocks):
            return blocks - block

    k0, k1 = lower_plan(model, plan)
    t = k1.thread_map
    bad = replace(k1, thread_map=OffByOne(t.threads, t.per_thread, t.vector, t.reverse))
    assert not verify_plan(model, plan, SIZES, trials=1, seeds=[3], lowerings=[k0, bad]).passed
