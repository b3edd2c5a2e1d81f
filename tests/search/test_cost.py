"""The analytic cost model: what it ranks first."""

from __future__ import annotations


def test_split_k_pays_for_its_reduction_where_the_output_is_large():
    """Regression: the cost model ranked split-K 4 first for the MoE up-projection (8192 x 14336
    outputs): it charged the partial sums as traffic hidden behind the main loop, so the search
    spent its first minute proving and timing split-K plans that lose."""
    from habu.compile import bind_shape
    from habu.lower import lower_plan
    from habu.search.cost import kernel_cost
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    t = TARGETS["sm_90a"]

    def cost(path, shape, split):
        m = bind_shape(next(iter(load_program(ROOT / "examples" / path).models.values())), shape)
        s = {e.name: e.size for e in m.extents}
        plan = default_plan(m, t, None, {"split_k": str(split)})
        return kernel_cost(lower_plan(m, plan)[0], s, t).seconds

    assert cost("moe_gather.habu", {}, 4) > 1.2 * cost("moe_gather.habu", {}, 1)
    # a small output over a long k: one wave of 4 tiles leaves most SMs idle; splitting pays
    small = {"M": 256, "N": 256, "K": 65536}
    assert cost("ggemm.habu", small, 8) < cost("ggemm.habu", small, 1)


def test_tma_stores_rank_above_register_stores_for_a_large_output():
    """The epilogue's direct stores are not hidden behind the main loop (H200: a bf16 GEMM 4096³
    took 189.5 µs with them, 171.1 µs with TMA stores)."""
    from habu.lower import lower_plan
    from habu.search.cost import kernel_cost
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    t = TARGETS["sm_90a"]
    m = load_program(ROOT / "examples" / "gemm.habu").models["GEMM"].with_sizes({"M": 4096, "N": 4096, "K": 4096})
    s = {e.name: e.size for e in m.extents}

    def cost(store):
        return kernel_cost(lower_plan(m, default_plan(m, t, s, {"store": store}))[0], s, t).seconds

    assert cost("tma") < 0.95 * cost("direct")


def test_the_roofline_is_the_tensor_cores_measured_ceiling_not_the_cost_models_rate():
    """The roofline bounds what any kernel can do: on sm_90a, wgmma alone at 898 TFLOP/s (the
    mma_ceiling probe), above the 810 the cost model predicts real kernels with. At 810 the search
    quoted the GGEMM winner at 94% of the roofline while the instructions alone ran 11% faster."""
    from habu.search.cost import KernelCost, compute_peak, roofline_seconds
    from habu.target import TARGETS

    c = TARGETS["sm_90a"].ceilings
    assert compute_peak(c) == c.wgmma_peak > c.wgmma_flops
    gemm = KernelCost(flops=2.0 * 4096**3, bytes=4096 * 4096 * 8.0, seconds=0.0, bound="compute")
    assert abs(roofline_seconds([gemm], TARGETS["sm_90a"]) * 1e6 - 153.0) < 1.0
    sm80 = TARGETS["sm_80"].ceilings
    assert compute_peak(sm80) == sm80.mma_sync_flops  # no wgmma there


def test_regression_a_row_kernel_reads_each_tensor_once():
    """SOFTMAX's equation reads x three times (x, max n' x, Σ exp(x - max n'' x)); the model
    charged each read as the whole tensor and predicted 94 µs for 8192x4096 (H200, 2026-12-01:
    36.8 µs measured, 86% of copy). A cached row is read once; an uncached one once per pass."""
    from habu.compile import bind_shape
    from habu.lower import lower_plan
    from habu.search.cost import kernel_cost
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    t = TARGETS["sm_90a"]
    m = bind_shape(load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"], {"C": 4096})
    sizes = {e.name: e.size for e in m.extents}
    cached = kernel_cost(lower_plan(m, default_plan(m, t))[0], sizes, t)
    assert cached.bytes == 2 * 8192 * 4096 * 2  # x read once, y written once
    assert 30e-6 < cached.seconds < 45e-6
    uncached = kernel_cost(lower_plan(m, default_plan(m, t, None, {"cache_row": "false"}))[0], sizes, t)
    assert uncached.bytes == (3 + 1) * 8192 * 4096 * 2  # two passes and the last one read x; y written


def test_regression_the_cost_model_ignored_pipeline_depth_and_the_gathered_operands_refills():
    """1715 GGEMM 4096³ plans timed on the H200 (2026-12-01) ranked against their predictions with a
    rank correlation of 0.40: the model gave 3 and 6 stages the same time (128x128 tiles: 268 against
    209 µs measured) and 256x64 tiles the time of 128x256 (409 against 184 µs: A, gathered by
    cp.async, is copied again for every tile column). It counts the bytes in flight and the refills."""
    from habu.lower import lower_plan
    from habu.search.cost import kernel_cost
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    t = TARGETS["sm_90a"]
    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    s = {e.name: e.size for e in m.extents}

    def cost(**pins: str) -> float:
        plan = default_plan(m, t, None, {"A": "cp.async", "store": "direct"} | pins)
        return kernel_cost(lower_plan(m, plan)[0], s, t).seconds

    assert cost(tile="128x128x64", stages="3") > 1.2 * cost(tile="128x128x64", stages="6")
    assert cost(tile="128x256x64", stages="2") > 1.2 * cost(tile="128x256x64", stages="4")
    assert cost(tile="256x64x64", stages="4", warps="12") > 1.5 * cost(tile="128x256x64", stages="4")
    assert cost(tile="128x256x64", stages="4") <= cost(tile="256x128x64", stages="4", warps="12")


def test_regression_a_gathered_operands_refill_counts_the_gathered_rows_not_the_table():
    """The MoE up-projection gathers 8192 of X's 32768 rows: the first refill term counted all 32768
    per tile column and predicted its winner (A gathered by cp.async, 1312 µs on the H200) at 2793
    µs, behind every plan that stages A first (1432 µs and slower)."""
    from habu.compile import bind_shape
    from habu.lower import lower_plan
    from habu.search.cost import kernel_cost, plan_cost
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    t = TARGETS["sm_90a"]
    m = bind_shape(load_program(ROOT / "examples" / "moe_gather.habu").models["MOE-UP"], {})
    s = {e.name: e.size for e in m.extents}
    winner = default_plan(m, t, None, {"tile": "128x256x64", "stages": "4", "A": "cp.async", "group_m": "16"})
    staged = default_plan(m, t, None, {"tile": "128x256x64", "stages": "4", "A": "staged", "persistent": "true"})
    gathered = kernel_cost(lower_plan(m, winner)[0], s, t).seconds
    assert gathered < sum(c.seconds for c in plan_cost(m, staged, t))
    assert gathered < 1.2 * 2 * 8192 * 14336 * 4096 / 810e12


def test_regression_cpu_search_top5_tied_at_187us():
    """Without a GPU the top 5 GGEMM 4096³ plans were all predicted 187.0 µs and ordered by DRAM
    bytes alone, which cannot tell stages, persistence or clusters apart. Timed on the H200
    (docs/PERF.md, 2026-12-01), deeper, persistent, multicast plans of the tied group were the
    fastest: the tie-break now puts such a plan first and separates the tied group."""
    from habu.lower import lower_plan
    from habu.plan.patterns import default_regions
    from habu.search.cost import kernel_cost, tie_break
    from habu.search.space import make_plan, region_space
    from habu.target import TARGETS
    from tests.conftest import ROOT
    from tests.search.test_search import model_of

    model, _ = model_of(ROOT / "examples" / "ggemm.habu", {})
    target = TARGETS["sm_90a"]
    fixed = {e.name: e.size for e in model.extents}
    ranked = []
    for k in region_space(model, default_regions(model)[0], target, fixed):
        if (k.tile_m, k.tile_n, k.store) != (128, 256, "tma"):  # the tied group's tiling (all of it)
            continue
        lw = lower_plan(model, make_plan(model, target, (k,), fixed))[0]
        ranked.append((round(kernel_cost(lw, fixed, target).seconds, 9), tie_break(lw, fixed, target), k))
    ranked.sort(key=lambda r: (r[0], r[1]))
    top = [r for r in ranked if r[0] == ranked[0][0]]
    assert len(top) >= 5
    assert len({r[1] for r in top}) >= 5
    first = top[0][2]
    assert first.persistent and first.stages == max(r[2].stages for r in top) and (first.cluster_m or 1) > 1


def test_regression_cpu_search_top5_tied_winner_stayed_the_default(tmp_path):
    """The tie-break ordered the candidates, but without a GPU a candidate replaced the region's best
    only when its predicted time was strictly lower, so the default plan (proven first) stayed the
    winner of every CPU search among equals. Now an equal prediction with better finer terms wins."""
    from habu.db import PlanDB
    from habu.search.loop import Budget, Search
    from habu.target import TARGETS
    from tests.conftest import ROOT
    from tests.search.test_search import model_of

    path = ROOT / "examples" / "ggemm.habu"
    model, sizes = model_of(path, {})
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(trials=3)).run()
    (winner,) = result.best.kernels
    assert winner.persistent and (winner.cluster_m or 1) > 1, winner


def test_regression_a_scalar_column_reduction_had_no_cost():
    """`habu search examples/fused.habu --model AXPY-RELU --backward --shape N=70` ended in a traceback
    (KeyError: '' in columns_cost): the gradient of the scalar a, `da = Σ n …`, is a column reduction of one
    column, whose column extent is "" (no axis); its cost reads the lowering's column count."""
    from habu.cli_grad import backward_program
    from habu.lower import lower_plan
    from habu.lower.columns import ColumnLowering
    from habu.search.cost import kernel_cost
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    grad, name = backward_program(load_program(ROOT / "examples" / "fused.habu"), "AXPY-RELU", None, "auto")
    sizes = {"N": 70}
    m = grad.model(name).with_sizes(sizes)
    lws = [lw for lw in lower_plan(m, default_plan(m, TARGETS["sm_90a"], sizes, {})) if isinstance(lw, ColumnLowering)]
    assert [lw.c for lw in lws] == [""]  # da: one column
    cost = kernel_cost(lws[0], sizes, TARGETS["sm_90a"])
    assert cost.flops == 2.0 * 70 and cost.seconds > 0


def test_the_weight_gradients_variants_are_ranked_as_an_h100_timed_them():
    """The cost model priced the weight gradient's variants alike (same FLOPs and bytes), so a search without a GPU
    stored any of them. At Mixtral's dW1 (4096 tokens, 8 experts) an H100 timed (2026-12-05, docs/PERF.md session
    54): the walk 6.50 ms, a block a tile 7.11, without the index ring 9.15, 64-row tiles under the walk 8.62 (f32
    A); the model now orders them so, and its walk's figure is within the H100's measured time (a floor-like
    estimate at the H200's ceilings, not above it)."""
    from dataclasses import replace

    from habu.lower import lower
    from habu.search.cost import kernel_cost
    from habu.search.space import default_plan
    from tests.prove.test_grouped_wgrad import SIZES, TARGET, _model

    sizes = {**SIZES, "R": 8192, "T": 4096, "M": 14336, "N": 4096, "G": 8}
    m = _model("WGRAD").with_sizes({"G": 8})
    (walk,) = default_plan(m, TARGET, sizes, {}).kernels
    variants = {"walk": walk, "tile": replace(walk, wgrad_persistent=False),
                "no ring": replace(walk, wgrad_persistent=False, wgrad_index_ring=False),
                "narrow walk": replace(walk, bm=64, warps_m=1)}
    ms = {name: kernel_cost(lower(m, k), sizes, TARGET).seconds * 1e3 for name, k in variants.items()}
    assert ms["walk"] < ms["tile"] < ms["no ring"] and ms["walk"] < ms["narrow walk"], ms
    assert 6.50 / 2 < ms["walk"] <= 6.50, ms


def test_regression_a_general_kernels_sibling_sums_were_multiplied():
    """A general kernel's iterations were the product of every loop's extent: attention's derived dK (a sum over
    (r, i, d) beside one over (r, i)) was costed R·I·D·R·I iterations a thread, not R·I·D + R·I."""
    from habu.search.cost import loop_iterations
    from habu.spec.ir import IndexVar, Load, Op, Reduce

    r, i, d = (IndexVar(x, f"#{x.upper()}") for x in "rid")
    sizes = {"#R": 4, "#I": 10, "#D": 8}
    inner = Reduce("sum", (r, i, d), Op("mul", (Load("A", (r, i, d)), Load("B", (d,)))))
    siblings = Op("add", (inner, Reduce("sum", (r, i), Load("C", (r, i)))))
    assert loop_iterations(siblings, sizes) == 4 * 10 * 8 + 4 * 10
    nested = Reduce("sum", (r,), Op("mul", (Load("X", (r,)), Reduce("sum", (d,), Load("Y", (r, d))))))
    assert loop_iterations(nested, sizes) == 4 * 8


def test_regression_attentions_derived_backward_was_costed_at_145_ms():
    """At the example's sizes the default plan of attention's backward was costed at 145.5 ms (dK 143.8): dK
    recomputed `Σ d dO·V` for each of its elements and its sibling sums were multiplied. Factored (dS one node,
    habu.spec.grad_factor) and costed as the loops run, it is well under a millisecond."""
    from habu.lower import lower_plan
    from habu.search.cost import plan_cost
    from habu.search.space import default_plan
    from habu.spec.grad_program import backward_name, with_backward
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    t = TARGETS["sm_90a"]
    for path, name in (("attention.habu", "ATTENTION-GQA"), ("decode_attention.habu", "DECODE-ATTENTION")):
        program = with_backward(load_program(ROOT / "examples" / path), backward_name(name))
        model = program.model(backward_name(name))
        plan = default_plan(model, t, None, {})
        assert len(lower_plan(model, plan)) >= 3
        assert sum(c.seconds for c in plan_cost(model, plan, t)) < 1e-3, name
