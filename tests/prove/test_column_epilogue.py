"""A column sum of a product's result computed in the product's epilogue (habu/plan/column_epilogue.py,
habu/lower/column_epilogue.py, habu/prove/column_epilogue.py): where the default takes it, that the plan is
proven and its CUDA prints the lowering's numbers, and where it is refused."""

from __future__ import annotations

from dataclasses import replace

from habu.bench.mutants_column_epilogue import pair_on_one_register, shuffle_across_pairs, writers_too_many
from habu.emit_cuda.nvrtc import _nvrtc, compile_cuda
from habu.lower import lower_plan, lower_whole
from habu.paths.emit import emit_lowered, emit_plan
from habu.prove import prove
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
DATA = ROOT / "tests" / "data" / "column_epilogue.habu"


def _model(sizes=None):
    model = load_program(DATA).models["BIASED-COLSUM"]
    return model.with_sizes(sizes) if sizes else model


def _ffn_backward():
    return derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP").model


def test_the_ffn_backward_sums_its_bias_gradients_in_the_products_epilogues():
    """dB1 beside dT2 (the chain's end) and dB2 beside dX (whose epilogue reads dT6 at each element): 5 kernels at
    128 tokens. At 4096 GELU's derivative is a kernel of its own, so dB1 keeps its column kernel; dB2 still joins
    dX, its 64 tile rows meeting in the launch's workspace."""
    model = _ffn_backward()
    short = [k.nodes for k in default_plan(model, T, {"B": 128}).kernels]
    assert ("%d3", "%d2", "%rdB1", "dB1") in short and ("%rdX", "dX", "%rdB2", "dB2") in short and len(short) == 5
    wide = [k.nodes for k in default_plan(model, T, {"B": 4096}).kernels]
    assert ("%rdB1", "dB1") in wide and ("%rdX", "dX", "%rdB2", "dB2") in wide and len(wide) == 7


def test_a_load_of_the_epilogue_is_summed_where_the_epilogue_reads_it():
    model = _ffn_backward().with_sizes({"B": 128})
    plan = default_plan(model, T, {})
    i = next(j for j, k in enumerate(plan.kernels) if "dB2" in k.nodes)
    lw = lower_plan(model, plan)[i]
    cs = lw.column_sum
    assert cs is not None and cs.summand is not None and cs.summand.tensor == "%d6" and cs.combine
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    src = emit_plan(model, plan, T).kernels[i].source
    assert "if (m < 128) { colsum[(2 * j)] += e0_0; colsum[((2 * j) + 1)] += e1_0; }" in src  # dT6's pair, not dX's


def test_a_product_whose_tile_holds_every_row_stores_its_column_sum_proven():
    model = _model()
    plan = default_plan(model, T, {})
    assert [k.nodes for k in plan.kernels] == [("V.mm", "V", "G")]
    proof = prove(model, plan, {}, trials=2)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    assert proof.certificate.checked["G"] == 3 * 64  # the sampled column tiles (first, second, last) of G
    assert any(o.rule.name == "column-epilogue-one-tile-row" for o in proof.obligations)


def test_the_cuda_prints_the_lowerings_shuffles_writers_and_slots():
    model = _model()
    plan = default_plan(model, T, {})
    (lw,) = lower_plan(model, plan)
    cs = lw.column_sum
    assert cs is not None and cs.consumers == 1 and cs.bn == lw.bn
    (kernel,) = emit_plan(model, plan, T).kernels
    src = kernel.source
    assert "__shfl_xor_sync(0xffffffffu, v, 4); v += __shfl_xor_sync(0xffffffffu, v, 8); v += " in src
    assert "if (lane < 4)" in src and "if (m < 40)" in src and "p_G" in src
    assert "colsum[(2 * j)] += v0; colsum[((2 * j) + 1)] += v1;" in src  # `register(j, q)`
    # a planted lowering is what is printed: the emitter reads its numbers from it
    lowered = lower_whole(model, plan)
    for plant, text in ((shuffle_across_pairs, "__shfl_xor_sync(0xffffffffu, v, 2)"), (writers_too_many, "lane < 8"),
                        (pair_on_one_register, "colsum[(2 * j)] += v1")):
        planted = emit_lowered(replace(lowered, kernels=(plant(lw),)), plan, T).kernels[0].source
        assert text in planted and text not in src, text
    if _nvrtc() is not None:
        res = compile_cuda(src, kernel.name, "sm_90a").resources
        assert not res.spills, res.describe()


def test_regression_a_planted_shuffle_is_caught_and_the_planted_cuda_differs():
    """The field check runs the lowering's shuffles: xor 2 adds another column pair's lanes."""
    model = _model()
    plan = default_plan(model, T, {})
    (lw,) = lower_plan(model, plan)
    cert = verify_plan(model, plan, {}, trials=1, seeds=[5], lowerings=[shuffle_across_pairs(lw)])
    assert not cert.passed and "G[" in (cert.failure or "")


def test_other_paths_keep_the_column_kernel():
    """mma.sync has no TMA-store buffers for the partials: the default leaves the sum to the column family."""
    model = _model()
    plan = default_plan(model, T, {}, {"mma": "mma.sync"})
    assert [k.kind for k in plan.kernels] == ["contraction", "columns"]


def test_a_hand_fused_plan_the_path_cannot_run_is_refused_naming_the_rule():
    model = _model()
    plan = default_plan(model, T, {}, {"mma": "mma.sync"})
    head, col = plan.kernels
    fused = replace(plan, kernels=(replace(head, nodes=(*head.nodes, *col.nodes)),))
    proof = prove(model, fused, {}, trials=1)
    assert not proof.ok and "supported-path" in {o.rule.name for o in proof.violations}


def test_several_tiles_of_m_meet_in_the_launchs_workspace():
    """#M = 300 in tiles of 64: each block stores its tile row's sums at tm·#N + n of a workspace and counts itself
    on its column tile's counter; the last to count finishes, and leaves the counter at 0 (zero-filled once)."""
    model = _model({"M": 300})
    plan = default_plan(model, T, {})
    (lw,) = lower_plan(model, plan)
    cs = lw.column_sum
    assert cs is not None and cs.combine and cs.arrivals({"M": 300}) == 5 and cs.m_tile == "M/64"
    proof = prove(model, plan, {}, trials=2)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    (kernel,) = emit_plan(model, plan, T).kernels
    assert kernel.workspace == (("$G.sums", "f32", ("M/64", "N")), ("$G.count", "i32", ("N/64",)))
    assert kernel.zero_once == ("$G.count",)
    assert "habu::last_block_done_among(" in kernel.source and "= 0;  // left for the next launch" in kernel.source
    if _nvrtc() is not None:
        res = compile_cuda(kernel.source, kernel.name, "sm_90a").resources
        assert not res.spills, res.describe()
    one = lower_plan(_model(), default_plan(_model(), T, {}))[0].column_sum  # #M = 40: one tile, no workspace
    assert one is not None and not one.combine


def test_the_search_tunes_the_joined_region_the_default_takes():
    """The join is a region of the default partition (habu/search/cuts.py `fuse_column_regions`), which the search
    tunes too: its candidates are the schedules that can print the sum (whole wgmma TMA-store tiles; several tiles
    of m meet in the workspace)."""
    from habu.paths import region_space
    from habu.plan.rewrite import apply_rewrites
    from habu.search.cuts import default_partition

    model = _ffn_backward()
    plan = default_plan(model, T, {"B": 128})
    sizes = dict(plan.shape)
    graph = apply_rewrites(model.with_sizes({"B": 128}), plan.rewrites)
    regions = default_partition(graph, T, sizes)
    assert [r.nodes for r in regions] == [k.nodes for k in plan.kernels]
    joined = next(r for r in regions if "dB1" in r.nodes)
    candidates = list(region_space(graph, joined, T, sizes))
    assert candidates and all(k.mma == "wgmma" and k.store == "tma" and k.split_k == 1 for k in candidates)
    assert {k.tile_m for k in candidates} >= {64, 128}  # one tile row or two


def test_a_column_epilogue_node_after_the_sum_is_the_finish():
    """`GH[n] = G[n] · 2` after `G[n] = Σ m V[m n]`: the finishing threads store the doubled sum in bf16."""
    model = load_program(DATA).models["BIASED-COLTWICE"]
    plan = default_plan(model, T, {})
    (kernel,) = plan.kernels
    assert kernel.nodes[-1] == "GH"
    proof = prove(model, plan, {}, trials=2)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    src = emit_plan(model, plan, T).kernels[0].source
    assert "habu::store_bf16(p_GH + (off), ((sum * 2.0f)));" in src


def test_regression_a_column_node_a_later_kernel_reads_widens_the_products_selection():
    """With #ONE = 17, dB[one h] = %rdB[h] broadcasts to 17 rows: a row kernel of its own reads %rdB, which the
    product's column sum stores. The product's blocks ran only the columns its own output's box held, and the check
    failed a correct plan ("dB2 reads %rdB2[128], which no earlier kernel wrote"): the columns later kernels
    demand of its column nodes widen its selection now (`column_demand`)."""
    model = _ffn_backward().with_sizes({"ONE": 17})
    plan = default_plan(model, T, {})
    assert ("%rdX", "dX", "%rdB2") in [k.nodes for k in plan.kernels] and ("dB2",) in [k.nodes for k in plan.kernels]
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]


def test_one_consumer_warpgroup_finishes_a_wider_tile_in_rounds():
    """128 consumer threads and a 256-column tile: thread t finishes columns t and t + 128 (`finisher_rounds`)."""
    model = _model({"M": 300, "N": 1000})
    plan = default_plan(model, T, {}, {"tile": "64x256x64"})
    (lw,) = lower_plan(model, plan)
    assert lw.column_sum is not None and lw.column_sum.finisher_rounds == 2 and lw.column_sum.finishers == 128
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    assert "for (int i = 0; i < 2; ++i) {  // thread t's columns" in emit_plan(model, plan, T).kernels[0].source


def test_the_report_says_what_a_products_epilogue_sums_and_how():
    from habu.compile import report

    model = _model({"M": 300})
    plan = default_plan(model, T, {})
    proof = prove(model, plan, {}, trials=1)
    text = report(model, [plan], [proof])
    assert ("Its epilogue also sums V over #M into G (G): each block stores its tile row's sums in a workspace of "
            "⌈#M/64⌉ × #N") in text
