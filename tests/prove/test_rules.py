"""The z3 rule tables: Triton #10927 and the other shipped bugs, as compile-time rejections."""

from __future__ import annotations

import pytest

from habu.prove.rules import COMMON, R, checked_rules, failures, guards, obligations
from habu.search.space import default_plan
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT, gemm_kn_source


def ggemm(**sizes):
    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"]
    return m.with_sizes(sizes) if sizes else m


def failed(model, target="sm_90a", sizes=None, pins=None):
    plan = default_plan(model, TARGETS[target], sizes, pins)
    return failures(obligations(model, plan, sizes)), plan


def test_triton_10927_tma_stride_rule_rejects_k511_on_sm90a():
    bad, _ = failed(ggemm(K=511), sizes={"K": 511}, pins={"B": "tma"})
    assert [(o.rule.name, o.tensor) for o in bad] == [("tma-stride-16B", "B")]
    assert "1022 bytes" in bad[0].detail
    assert "Triton #10927" in bad[0].rule.source


def test_triton_10927_gather4_on_sm100a_rejects_k511():
    bad, plan = failed(ggemm(K=511), "sm_100a", {"K": 511}, {"A": "tma"})
    assert plan.kernels[0].a_move == "tma-gather4"
    assert [(o.rule.name, o.tensor) for o in bad] == [("tma-stride-16B", "A")]


def test_k512_with_tma_passes():
    bad, _ = failed(ggemm(K=512), sizes={"K": 512}, pins={"B": "tma"})
    assert bad == []


def test_gather_cannot_use_plain_tma_on_sm90a():
    bad, _ = failed(ggemm(), pins={"A": "tma"})
    assert [o.rule.name for o in bad] == ["tma-gather"]
    assert "sm_100+" in bad[0].detail


def test_gather4_rows_pass_at_k512_on_sm100a():
    bad, _ = failed(ggemm(K=512), "sm_100a", {"K": 512}, {"A": "tma"})
    assert bad == []


def test_runtime_extent_gets_a_guard_with_a_counterexample():
    src = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
    model = parse_text(src).models["GGEMM"]
    plan = default_plan(model, TARGETS["sm_90a"], None, {"B": "tma"})
    obs = obligations(model, plan)
    assert not failures(obs)
    g = {o.rule.name: o for o in guards(obs)}
    assert "tma-stride-16B" in g
    k = g["tma-stride-16B"].counterexample["K"]
    assert (2 * k) % 16 != 0


def test_int32_offsets_rule_catches_a_wrap():
    from dataclasses import replace

    m = ggemm(M=600_000, N=64)
    plan = default_plan(m, TARGETS["sm_90a"], {"M": 600_000, "N": 64})
    assert plan.kernels[0].index_width == 64  # the default already widens
    forced = replace(plan, kernels=(replace(plan.kernels[0], index_width=32),))
    bad = failures(obligations(m, forced, {"M": 600_000, "N": 64}))
    assert "int32-offsets" in {o.rule.name for o in bad}


@pytest.mark.parametrize("pins, rule", [
    ({"tile": "128x136x64"}, "mma-shape"),  # wgmma N ≡ 8 mod 16 (tilelang #2593)
    ({"tile": "256x256x64", "stages": "6"}, "smem-budget"),
    ({"tile": "256x256x64", "warps": "4"}, "register-budget"),
    ({"A": "cp.async", "vector": "16"}, "cp.async-size"),
    ({"B": "tma", "tile": "64x512x64"}, "tma-box"),  # a 512-row box: TMA boxes are at most 256
])
def test_rule_violations(pins, rule):
    bad, _ = failed(ggemm(), pins=pins)
    assert rule in {o.rule.name for o in bad}, [o.describe() for o in bad]


def test_cp_async_alignment_at_k511():
    bad, _ = failed(ggemm(K=511), sizes={"K": 511}, pins={"A": "cp.async", "vector": "8"})
    assert "cp.async-size" in {o.rule.name for o in bad}


def test_every_target_has_a_rule_table():
    assert "tma-stride-16B" not in checked_rules(TARGETS["sm_80"])
    assert {"tma-stride-16B", "setmaxnreg-pool"} <= checked_rules(TARGETS["sm_90a"])


def test_every_rule_a_target_names_exists_and_every_rule_is_checked_somewhere():
    """A target file names its rule families by string (habu/targets/ imports nothing above it): a
    misspelt name would silently check nothing, and a rule in no table is dead."""
    for t in TARGETS.values():
        assert set(t.rules) <= set(R), (t.name, set(t.rules) - set(R))
    assert set(COMMON) <= set(R)
    assert set(R) == set(COMMON).union(*(t.rules for t in TARGETS.values()))


def test_default_plans_of_every_example_break_no_rule():
    for path in sorted((ROOT / "examples").glob("*.habu")):
        for m in load_program(path).models.values():
            for t in TARGETS:
                bad, _ = failed(m, t)
                assert bad == [], (path.name, m.name, t, [o.describe() for o in bad])


# -- regression: the 20-warp wgmma kernel that hung on the H200 (2026-11-30) ---------------------

def moe_20_warp_plan():
    from habu.plan.plan import with_fields
    from habu.search.space import concrete_sizes, make_plan

    m = load_program(ROOT / "examples" / "moe_gather.habu").models["MOE-UP"]
    sizes = concrete_sizes(m, {})
    base = default_plan(m, TARGETS["sm_90a"], sizes)
    k = with_fields(base.kernels[0], tile_m=256, tile_n=96, warps=20, stages=3, split_k=2, group_m=1, store="direct")
    return m, sizes, make_plan(m, TARGETS["sm_90a"], (k,), sizes)


def test_regression_setmaxnreg_hang_20_warps_asked_more_registers_than_the_cta_has():
    from habu.lower.registers import RegisterSplit, warp_specialized_split

    # what the emitter used to write for every warp count: 40 + 4 × 232 per thread of a warpgroup
    old = RegisterSplit(threads=640, consumers=4, at_launch=96, producer=40, consumer=232)
    assert not old.fits and old.demand == 123904 and old.pool == 61440
    new = warp_specialized_split(20)
    assert new.fits and (new.producer, new.consumer) == (40, 104)
    # the splits timed on the H200 are unchanged
    assert (warp_specialized_split(12).consumer, warp_specialized_split(8).consumer) == (232, 232)
    for warps in range(8, 33, 4):
        assert warp_specialized_split(warps).fits, warps


def test_regression_setmaxnreg_hang_20_warps_emits_what_the_rule_checked():
    from habu.paths.emit import emit_plan

    m, sizes, plan = moe_20_warp_plan()
    assert failures(obligations(m, plan, sizes)) == []
    pool = [o for o in obligations(m, plan, sizes) if o.rule.name == "setmaxnreg-pool"]
    assert len(pool) == 1 and pool[0].formula is True and "4 × consumer 104" in pool[0].statement
    (kernel,) = emit_plan(m, plan, TARGETS["sm_90a"]).kernels
    assert "setmaxnreg_inc<104>" in kernel.source and "setmaxnreg_dec<40>" in kernel.source


def test_regression_setmaxnreg_hang_20_warps_compiled_kernel_has_the_registers():
    """ptxas decides how many registers the CTA starts with: checked after every compile."""
    import dataclasses

    from habu.paths.emit import emit_plan
    from habu.search.tasks import compile_plan

    m, _sizes, plan = moe_20_warp_plan()
    ((_key, cubin),) = compile_plan(m, plan)  # checks threads × registers ≥ the demand
    (kernel,) = emit_plan(m, plan, TARGETS["sm_90a"]).kernels
    assert kernel.threads * cubin.resources.registers >= kernel.register_demand == 58368
    greedy = dataclasses.replace(kernel, register_demand=128 * (40 + 4 * 232))
    with pytest.raises(ValueError, match="the kernel would hang"):
        greedy.check_registers(cubin.resources.registers)


def gemm_kn(n: int = 776):
    return parse_text(gemm_kn_source(n=n, k=512)).models["GEMM-KN"]


def test_a_b_contiguous_along_n_feeds_wgmma_through_tma_boxes_of_64_columns():
    bad, plan = failed(gemm_kn(), pins={"tile": "128x128x64"})
    (k,) = plan.kernels
    assert (k.mma, k.b_move, bad) == ("wgmma", "tma", [])
    box = next(o for o in obligations(gemm_kn(), plan) if o.rule.name == "tma-box" and o.tensor == "B")
    assert "box 64x64, 2 per tile of 128" in box.statement


@pytest.mark.parametrize("pins,reason", [({"B": "cp.async", "mma": "wgmma"}, "along n when loaded by TMA"),
                                         ({"tile": "128x96x64", "mma": "wgmma"}, "along n when loaded by TMA")])
def test_wgmma_refuses_an_n_major_b_it_cannot_read(pins, reason):
    bad, _ = failed(gemm_kn(), pins=pins)
    (path,) = [o for o in bad if o.rule.name == "supported-path"]
    assert reason in path.detail


def test_an_n_major_b_with_rows_off_the_16_byte_rule_is_not_read_by_tma():
    bad, plan = failed(gemm_kn(777))  # rows of 1554 bytes
    assert plan.kernels[0].b_move != "tma" and bad == []
    bad, _ = failed(gemm_kn(777), pins={"B": "tma", "mma": "wgmma"})
    assert [o.rule.name for o in bad] == ["tma-stride-16B"]


@pytest.mark.parametrize("pins,sizes,rule", [({"store": "tma", "split_k": "2"}, {}, "supported-path"),
                                             ({"store": "tma", "mma": "mma.sync"}, {}, "supported-path"),
                                             ({"store": "tma"}, {"N": 777}, "tma-stride-16B"),
                                             ({"store": "tma", "stages": "5"}, {}, "smem-budget")])
def test_tma_stores_are_refused_where_they_cannot_run(pins, sizes, rule):
    bad, _ = failed(ggemm(**sizes), sizes=sizes or None, pins=pins)
    assert rule in [o.rule.name for o in bad]


def test_tma_stores_pass_at_the_example_shape_with_two_buffers_per_consumer():
    bad, plan = failed(ggemm(), pins={"store": "tma"})
    assert bad == []
    obs = [o for o in obligations(ggemm(), plan) if o.rule.name == "tma-smem-align" and o.tensor == "O"]
    assert len(obs) == 4  # two consumer warpgroups, two boxes each


def test_a_formula_asked_again_is_answered_from_z3s_earlier_answer():
    """A search asks the same bounds of many plans that share a lowering: each formula goes to z3
    once per process. The answer, counterexample included, is the same as the first."""
    from habu.prove import obligation as rules  # the solver's answers are kept there

    src = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
    model = parse_text(src).models["GGEMM"]
    plan = default_plan(model, TARGETS["sm_90a"], None, {"B": "tma"})
    rules._DISCHARGED.clear()
    first = {(o.rule.name, o.tensor, o.statement): o for o in obligations(model, plan)}
    solved = len(rules._DISCHARGED)
    again = {(o.rule.name, o.tensor, o.statement): o for o in obligations(model, plan)}
    assert solved and len(rules._DISCHARGED) == solved
    for k, o in again.items():
        assert (o.status, o.counterexample) == (first[k].status, first[k].counterexample)
    stride = next(o for o in again.values() if o.rule.name == "tma-stride-16B")
    assert stride.status == "guarded" and "the same formula as an earlier plan's" in stride.how


WINNER = {"tile": "128x256x64", "stages": "4", "persistent": "true", "group_m": "1", "raster": "column"}


@pytest.mark.parametrize("pins,sizes,rule", [({"cluster": "2", "stages": "3"}, {"M": 300}, "cluster-tiles"),
                                             ({"cluster": "2", "B": "cp.async"}, {}, "supported-path"),
                                             ({"cluster": "2", "split_k": "2"}, {}, "supported-path"),
                                             ({"cluster": "2", "mma": "mma.sync"}, {}, "supported-path"),
                                             ({"cluster": "2", "tile": "128x200x64"}, {}, "supported-path")])
def test_clusters_are_refused_where_they_cannot_run(pins, sizes, rule):
    bad, _ = failed(ggemm(**sizes), sizes=sizes or None, pins=pins)
    assert rule in [o.rule.name for o in bad], bad


def test_an_odd_count_of_tile_rows_fails_the_cluster_rule_with_the_reason():
    bad, _ = failed(ggemm(M=300), sizes={"M": 300}, pins=WINNER | {"cluster": "2", "stages": "3"})
    assert [o.rule.name for o in bad] == ["cluster-tiles"]
    assert "not a multiple of 2" in bad[0].detail


def test_clusters_on_sm80_name_the_missing_feature():
    bad, _ = failed(ggemm(), "sm_80", pins={"cluster": "2", "mma": "mma.sync"})
    assert "target-feature" in [o.rule.name for o in bad]


def test_the_winner_with_a_cluster_passes_every_rule_and_halves_b_boxes():
    model = ggemm()
    bad, plan = failed(model, pins=WINNER | {"cluster": "2", "store": "tma", "stages": "3"})
    assert bad == [] and plan.kernels[0].cluster_m == 2
    box = [o for o in obligations(model, plan) if o.rule.name == "tma-box" and o.tensor == "B"]
    assert box and "64x128" in box[0].statement  # each block loads half of B's 256 rows


def test_a_runtime_m_gets_a_cluster_guard():
    src = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #M", "1..65536 EXTENT: #M")
    model = parse_text(src).models["GGEMM"]
    plan = default_plan(model, TARGETS["sm_90a"], None, {"cluster": "2", "tile": "128x256x64", "stages": "3"})
    obs = obligations(model, plan)
    assert not failures(obs)
    assert "cluster-tiles" in {o.rule.name for o in guards(obs)}


# ----------------------------------------------------------------------------- fields and launches


def _rules_broken(model, plan, sizes=None):
    return [(o.rule.name, o.detail) for o in failures(obligations(model, plan, sizes))]


def _with_kernel(plan, i=0, **changes):
    from habu.plan.plan import with_fields

    kernels = list(plan.kernels)
    kernels[i] = with_fields(kernels[i], **changes)
    return plan.__class__(**{**plan.__dict__, "kernels": tuple(kernels)})


def test_regression_ggemm_k511_one_stage_pin_is_refused():
    """`habu compile examples/ggemm.habu --shape M=300,N=200,K=511 --pin stages=1` was certified:
    a one-stage mbarrier ring deadlocks the wgmma consumers."""
    sizes = {"M": 300, "N": 200, "K": 511}
    m = ggemm(**sizes)
    plan = default_plan(m, TARGETS["sm_90a"], sizes, {"stages": "1"})
    assert plan.kernels[0].mma == "wgmma"
    assert ("pipeline-stages", "stages = 1") in _rules_broken(m, plan, sizes)
    sync = default_plan(m, TARGETS["sm_90a"], sizes, {"mma": "mma.sync", "stages": "1"})
    # the cp.async ring's simulation names what goes wrong: tile 0's copy has not landed when it is read
    assert {r for r, _ in _rules_broken(m, sync, sizes)} == {"pipeline-stages", "pipeline-schedule"}
    fma = default_plan(m, TARGETS["sm_90a"], sizes, {"mma": "fma", "stages": "1"})
    assert _rules_broken(m, fma, sizes) == []  # the SIMT path does not pipeline


@pytest.mark.parametrize("path, model, sizes, threads", [
    ("softmax.habu", "SOFTMAX-ROWS", {"R": 64, "C": 1000}, 48),
    ("rmsnorm.habu", "RMSNORM-ROWS", {"D": 1024}, 40),
])
def test_regression_row_kernel_of_a_partial_warp_built_in_python_is_refused(path, model, sizes, threads):
    """threads=48 on a 64x1000 softmax, 40 on RMSNorm were certified and wrong on the GPU: the
    block reduction keeps one partial per whole warp. A plan built in Python is refused by rule."""
    m = load_program(ROOT / "examples" / path).models[model].with_sizes(sizes)
    plan = _with_kernel(default_plan(m, TARGETS["sm_90a"], sizes), threads=threads)
    assert _rules_broken(m, plan, sizes) == [
        ("plan-fields", f"threads = {threads}: expected a whole number in 32..1024, a multiple of 32")]


@pytest.mark.parametrize("change", [{"tile_k": 0}, {"tile_m": 0}, {"tile_n": 0}, {"warps": 0}, {"stages": 0},
                                    {"split_k": 0}, {"group_m": 0}, {"cluster_m": 0}, {"index_width": 48},
                                    {"a_vector": 0}, {"swizzle": 48}])
def test_a_contraction_field_out_of_range_is_refused_by_rule_not_a_zero_division(change):
    """tile_k = 0 or warps = 0 raised ZeroDivisionError in the rules; now the field rule refuses the
    kernel before it is lowered (quick_reject too)."""
    from habu.prove.rules import quick_reject

    m = ggemm()
    plan = _with_kernel(default_plan(m, TARGETS["sm_90a"]), **change)
    (name, _), = change.items()
    broken = _rules_broken(m, plan)
    assert broken[0][0] == "plan-fields" and broken[0][1].startswith(f"{name} = ")
    assert {r for r, _ in broken} <= {"plan-fields", "pipeline-stages"}  # stages = 0 is both
    assert quick_reject(m, plan).rule.name == "plan-fields"


@pytest.mark.parametrize("change", [{"rows_per_block": 0}, {"vector": 0}, {"cluster": 3}, {"index_width": 16}])
def test_a_row_field_out_of_range_is_refused_by_rule(change):
    m = load_program(ROOT / "examples" / "softmax.habu").models["SOFTMAX-ROWS"]
    plan = _with_kernel(default_plan(m, TARGETS["sm_90a"]), **change)
    assert [r for r, _ in _rules_broken(m, plan)] == ["plan-fields"]


def test_regression_staged_ggemm_at_m100000_grid_y_is_refused():
    """A staged GGEMM at M = 100000 was certified with a staging grid.y of 100000 (the limit is
    65535); the default no longer stages so many rows."""
    sizes = {"M": 100000, "K": 511}
    m = ggemm(**sizes)
    staged = default_plan(m, TARGETS["sm_90a"], sizes, {"A": "staged"})
    assert ("grid-dims", "grid.y = 100000 (blocks along the rows (#M)) exceeds 65535 blocks") \
        in _rules_broken(m, staged, sizes)
    default = default_plan(m, TARGETS["sm_90a"], sizes)
    assert default.kernels[0].a_move != "staged" and _rules_broken(m, default, sizes) == []


def test_regression_fused_n2147483644_threads96_lane_index_wraps():
    """`habu compile examples/fused.habu --shape N=2147483644 --pin threads=96` was certified; the
    map lane index (blockIdx.x*96+threadIdx.x)*4 wraps negative in 32 bits."""
    sizes = {"N": 2147483644}
    m = load_program(ROOT / "examples" / "fused.habu").models["AXPY-RELU"].with_sizes(sizes)
    bad = default_plan(m, TARGETS["sm_90a"], sizes, {"threads": "96"})
    broken = _rules_broken(m, bad, sizes)
    assert [r for r, _ in broken] == ["int32-offsets"] and "(blockIdx.x·96 + threadIdx.x)·4" in broken[0][1]
    assert _rules_broken(m, default_plan(m, TARGETS["sm_90a"], sizes, {"threads": "96", "index": "64"}), sizes) == []
    assert _rules_broken(m, default_plan(m, TARGETS["sm_90a"], sizes), sizes) == []  # 256·4 divides 2^31


def test_the_map_lane_rule_guards_a_runtime_extent():
    src = (ROOT / "examples" / "fused.habu").read_text().replace("16777216 EXTENT: #N", "1..2147483647 EXTENT: #N")
    m = parse_text(src).models["AXPY-RELU"]
    plan = default_plan(m, TARGETS["sm_90a"], None, {"threads": "96"})
    lanes = [o for o in guards(obligations(m, plan)) if o.rule.name == "int32-offsets" and "lane" in o.statement]
    assert len(lanes) == 1 and lanes[0].counterexample["N"] > 2**31 - 384


def test_regression_z3_4_15_timed_out_on_runtime_k_tma_bounds(monkeypatch):
    """On the H200 (z3 4.15 from .device-site) the `bounds` obligation of a runtime-K TMA GGEMM —
    row·K + k < 256·K — timed out in z3's default integer strategy and was read as violated, so
    `habu compile` refused a plan that z3 5.4 proves. An undecided obligation now gets nlsat's
    second opinion. Here the default solver is made to give up, as 4.15's did."""
    import z3

    from habu.prove import obligation

    real_solver = z3.Solver

    class GivesUp:
        def __init__(self):
            self.inner = real_solver()

        def set(self, *a):
            pass

        def add(self, *a):
            self.inner.add(*a)

        def check(self):
            return z3.unknown

        def reason_unknown(self):
            return "timeout"

    monkeypatch.setattr(obligation.z3, "Solver", GivesUp)
    K, n, k = z3.Ints("K n k")
    f = z3.Implies(z3.And(n >= 0, n < 256, k >= 0, k < K), z3.And(n * K + k >= 0, n * K + k < 256 * K))
    ob = obligation.Obligation(obligation.INT32_OFFSETS, "kernel 0", "B", "in bounds", f)
    ctx = obligation.Context(model=None, plan=None, target=None, ext={"K": K}, domain=[K >= 1, K <= 65536])
    assert obligation._solve(ob, f, ctx).status == "proved"
    # a false statement stays undecided (violated), not proved
    wrong = z3.Implies(z3.And(n >= 0, n < 256, k >= 0, k < K), n * K + k < 255 * K)
    ob2 = obligation.Obligation(obligation.INT32_OFFSETS, "kernel 0", "B", "in bounds", wrong)
    assert obligation._solve(ob2, wrong, ctx).status == "violated"


def test_the_int32_rule_evaluates_the_row_kernels_thread_map():
    """A row kernel's 32-bit lane arithmetic (its row, a thread's chunk index after its loop's last
    increment, its last column, its last cache slot) is stated from the lowering's thread map
    (`RowLowering.chunk_loop`), at every width of a runtime row: a map whose chunks are 2^31 apart
    breaks it, the real one does not."""
    from dataclasses import replace

    from habu.lower import lower_whole
    from habu.prove.obligation import context, discharge
    from habu.prove.rules_fields import launch_obligations

    m = load_program(ROOT / "examples" / "rmsnorm.habu").models["RMSNORM-ROWS"]  # #D is a runtime extent
    plan = default_plan(m, TARGETS["sm_90a"], {"D": 4096}, {"cache_row": "true", "threads": "256"})
    (lw,) = lower_whole(m, plan).kernels
    ctx = context(m, plan)

    def lanes(lowering):
        return [discharge(o, ctx) for o in launch_obligations("k", lowering, ctx) if o.rule.name == "int32-offsets"]

    fine = lanes(lw)
    assert {"row", "chunk index", "column"} <= {w for o in fine for w in ("row", "chunk index", "column")
                                               if w in o.statement}
    assert all(o.status == "proved" for o in fine), [(o.statement, o.status) for o in fine]
    far = replace(lw, thread_map=replace(lw.thread_map, chunk_stride=2**31))
    assert any(o.status == "violated" and "chunk index" in o.statement for o in lanes(far))


ROW_WITH_F32_SCALE = """4 EXTENT: #R   65536 EXTENT: #D
bf16 TENSOR: X ( #R #D )   f32 TENSOR: s ( #R )   bf16 TENSOR: Y ( #R #D )
MODEL: SCALED-RMS  Y[r d] = X[r d] · s[r] · rsqrt( Σ d' X[r d'] · X[r d'] / #D + 0.000001 ) ;
"""


def test_regression_rows_smem_rule_counts_the_kept_row_not_the_widest_load():
    """The kept bf16 row of 65536 columns (128 KiB) fits a block; the rule counted the f32 per-row
    value's 4 bytes for every column (256 KiB) and refused the plan."""
    from dataclasses import replace

    from habu.lower.rows import lower_rows
    from habu.paths.rows import PATH

    model = parse_text(ROW_WITH_F32_SCALE).models["SCALED-RMS"]
    plan = default_plan(model, TARGETS["sm_90a"])
    cached = replace(plan.kernels[0], threads=256, cache_row=True, rows_per_block=1, cluster=1, prefetch=False)
    plan = replace(plan, kernels=(cached,))
    smem = [o for o in obligations(model, plan) if o.rule.name == "smem-budget"]
    assert smem and not failures(smem), [o.statement for o in smem]
    assert "2·#D" in smem[0].statement
    assert PATH.smem_bytes(lower_rows(model, cached), {"R": 4, "D": 65536}) == 2 * 65536


def test_regression_a_scalar_column_reduction_with_a_wide_tile_raced_past_the_rules():
    """Searching AXPY-RELU's backward (`da = Σ n …`, a scalar) at N = 70: 24 candidates with tiles of several
    columns passed every rule and failed the field check ("writes da at offset 0 16 times"): a scalar's store
    has no column to mask, so every column lane stored it. The rule `scalar-one-column` refuses them."""
    from habu.cli_grad import backward_program
    from habu.prove import prove
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    grad, name = backward_program(load_program(ROOT / "examples" / "fused.habu"), "AXPY-RELU", None, "auto")
    sizes = {"N": 70}
    m = grad.model(name).with_sizes(sizes)
    assert prove(m, default_plan(m, TARGETS["sm_90a"], sizes, {}), sizes, trials=1).ok  # one column: fine
    wide = prove(m, default_plan(m, TARGETS["sm_90a"], sizes, {"column_threads": "16"}), sizes, trials=1)
    assert [o.rule.name for o in wide.violations] == ["scalar-one-column"] and wide.certificate is None


def test_regression_a_staged_operand_read_in_vectors_past_its_bound_breaks_cp_async_size(monkeypatch):
    """A staged buffer's rows are padded to 16 bytes past #K: at K = 511 its row stride is aligned, so the
    alignment obligation held, yet an 8-element vector whose first element is the last k read 7 elements of
    padding the staging pass never wrote (a vector's mask is its first element's). Session 69: the vectors had to
    end at the access's bound. Session 70: the pass writes zeros into the padding, and the obligation reads the row
    it writes (`StageLowering.padded`): vectors of 2 and 8 at K = 511 hold; a pass planted to write k < #K only
    breaks it again."""
    from dataclasses import replace

    import habu.lower.contraction as contraction

    for vector in ("2", "8"):
        ok, _ = failed(ggemm(K=511), sizes={"K": 511}, pins={"mma": "mma.sync", "A": "staged", "vector": vector})
        assert not ok, [o.describe() for o in ok]
    real = contraction.staged

    def unpadded(src, axis, rows, k, suffix="", batch=()):
        read, stage = real(src, axis, rows, k, suffix, batch)
        return read, replace(stage, dst=replace(stage.dst, masks=read.masks))

    monkeypatch.setattr(contraction, "staged", unpadded)
    bad, _ = failed(ggemm(K=511), sizes={"K": 511}, pins={"mma": "mma.sync", "A": "staged", "vector": "2"})
    assert any(o.rule.name == "cp.async-size" and o.tensor == "@A" for o in bad), [o.describe() for o in bad]
