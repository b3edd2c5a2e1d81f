"""The grouped-GEMM family (habu/lower/grouped.py): the region it takes, its tile scheduler executed over
GF(p) for hand-made groupings (empty groups first, inside and last, groups smaller than a tile, a group
longer than a tile, one group holding every row), its rules, and the MoE models' default plans proven
through it and compiled by NVRTC where NVRTC is available."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from habu.lower import GeneralLowering, GroupedLowering, lower, lower_plan
from habu.lower.grouped import tile_starts
from habu.plan.patterns import default_regions
from habu.plan.plan import GroupedKernel
from habu.prove import prove
from habu.prove.interp import Memory
from habu.prove.interp_grouped import group_offsets, run_grouped
from habu.prove.verify import virtual_inputs
from habu.prove.virtual import GroupedVirtualTensor
from habu.search.space import default_plan
from habu.spec.field import PrimeField
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
GG = """37 EXTENT: #R  20 EXTENT: #T  4 EXTENT: #G  40 EXTENT: #N  40 EXTENT: #K
bf16 TENSOR: X ( #T #K )  bf16 TENSOR: W ( #G #N #K )  f32 TENSOR: Y ( #R #N )
ITENSOR: IX ( #R #T )  GROUPS: E ( #R #G )
MODEL: GG
   Y[r n] = Σ k X[IX[r] k] · W[E[r] n k] · 2 ;
"""
KERNEL = GroupedKernel(nodes=("Y",), bm=16, bn=32, bk=32, warps_m=1, warps_n=2)  # 64 threads, 1 × 2 mma tiles a warp
SIZES = {"R": 37, "T": 20, "G": 4, "N": 40, "K": 40}
GROUPINGS = {  # 37 rows into 4 groups; tiles of 16 rows
    "first-empty": [1] * 10 + [2] * 20 + [3] * 7,
    "inner-empty": [0] * 5 + [2] * 30 + [3] * 2,
    "last-empty": [0] * 17 + [1] * 3 + [2] * 17,
    "smaller-than-a-tile": [0] * 3 + [1] * 1 + [2] * 5 + [3] * 28,
    "one-group-holds-every-row": [2] * 37,
    "every-group-several-tiles": [0] * 1 + [1] * 16 + [2] * 17 + [3] * 3,
}


def _gg():
    return parse_text(GG).models["GG"]


class FixedGrouping(GroupedVirtualTensor):
    """A grouping whose values the test chooses (sorted, groups left empty where it says)."""

    def __init__(self, values: list[int], groups: int):
        super().__init__("E", (len(values),), groups, np.uint64(1))
        self.table = np.asarray(values, dtype=np.int64)


def _run(values: list[int], kernel: GroupedKernel = KERNEL, lw: GroupedLowering | None = None):
    model = _gg()
    lw = lw or lower(model, kernel)
    assert isinstance(lw, GroupedLowering)
    field = PrimeField(seed=3)
    inputs = virtual_inputs(model, SIZES, field, 3)
    inputs["E"] = FixedGrouping(values, SIZES["G"])
    mem = Memory(inputs, field, SIZES)
    gx, gy = (int(x) for x in lw.grid(SIZES))
    run_grouped("k0", lw, SIZES, mem, [(mt, nt) for nt in range(gy) for mt in range(gx)])
    # the reference: Y[r n] = 2 · Σ k X[IX[r] k] · W[E[r] n k] over GF(p)
    R, N, K = SIZES["R"], SIZES["N"], SIZES["K"]
    ix = inputs["IX"].at(np.arange(R))
    x = inputs["X"][ix[:, None], np.arange(K)[None, :]]
    w = inputs["W"][np.asarray(values)[:, None, None], np.arange(N)[None, :, None], np.arange(K)[None, None, :]]
    ref = np.einsum("rk,rnk->rn", x.astype(object), w.astype(object)) * 2 % field.p
    written = mem.written.get("Y")
    got, found = written.read(np.arange(R * N)) if written is not None else (np.zeros(R * N, np.int64),
                                                                              np.zeros(R * N, bool))
    dup, _ = written.multiply_written() if written is not None else (np.zeros(0), None)
    return mem, got.reshape(R, N), found.reshape(R, N), ref.astype(np.int64), len(dup)


def test_the_moe_default_is_the_grouped_family_wgmma_and_fused_on_sm_90a_and_mma_sync_on_sm_80():
    """gate and up are grouped regions, the combine a general one the grouped family also takes; the default
    plan computes all of them grouped: on sm_90a the wgmma loop with gate, up and SwiGLU fused, on sm_80
    mma.sync kernels (issue 20 §1). A grouped pin (family, pair, main_loop, a tile) replaces the default."""
    m = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    kinds = {r.nodes[-1]: r.kind for r in default_regions(m)}
    assert kinds == {"gate": "grouped", "up": "grouped", "act": "rows", "Y": "general"}
    plan = default_plan(m, TARGET, {}, {})
    assert [(k.kind, k.main_loop, k.nodes) for k in plan.kernels] == [
        ("grouped", "wgmma", ("gate", "up", "act")), ("grouped", "wgmma", ("Y",))]
    sm80 = default_plan(m, TARGETS["sm_80"], {}, {})
    assert [(k.kind, getattr(k, "main_loop", None)) for k in sm80.kernels] == [
        ("grouped", "mma.sync"), ("grouped", "mma.sync"), ("rows", None), ("grouped", "mma.sync")]
    general = default_plan(m, TARGET, {}, {"family": "general"})
    assert [k.kind for k in general.kernels] == ["general", "general", "rows", "general"]
    mma = default_plan(m, TARGET, {}, {"family": "grouped"})
    assert {getattr(k, "main_loop", None) for k in mma.kernels} == {"mma.sync", None}
    assert [type(lw).__name__ for lw in lower_plan(m, plan)] == ["GroupedLowering", "GroupedLowering"]


@pytest.mark.parametrize("text", [
    GG.replace("GROUPS: E ( #R #G )", "ITENSOR: E ( #R #G )"),  # not a grouping: rows of a group may be apart
    GG.replace("bf16 TENSOR: W", "f32 TENSOR: W"),  # f32 weights: no bf16 mma.sync
])
def test_a_gathered_weight_gemm_the_grouped_family_cannot_take_stays_general(text):
    m = parse_text(text).models["GG"]
    assert [r.kind for r in default_regions(m)] in (["general"],)
    assert isinstance(lower_plan(m, default_plan(m, TARGET, {}, {}))[0], GeneralLowering)


@pytest.mark.parametrize("name", list(GROUPINGS))
def test_the_tile_scheduler_writes_every_row_once_with_its_groups_weights(name):
    mem, got, found, ref, duplicates = _run(GROUPINGS[name])
    assert not mem.faults, mem.faults
    assert found.all() and duplicates == 0
    np.testing.assert_array_equal(got, ref)


def test_the_offsets_are_the_first_row_of_each_group_and_an_empty_group_has_no_tile():
    lw = lower(_gg(), KERNEL)
    field = PrimeField(seed=1)
    inputs = virtual_inputs(_gg(), SIZES, field, 1)
    inputs["E"] = FixedGrouping(GROUPINGS["inner-empty"], 4)
    offs = group_offsets(lw, SIZES, Memory(inputs, field, SIZES))
    assert offs == [0, 5, 5, 35, 37]
    assert tile_starts(lw, offs) == [0, 1, 1, 3, 4]  # group 1 empty: no tile; 30 rows: 2 tiles of 16
    assert int(lw.grid(SIZES)[0]) >= 4


def test_regression_a_tile_count_rounded_down_leaves_a_small_groups_rows_unwritten():
    """The scheduler's row tiles per group rounded down ((hi − lo) // bm): a group smaller than a tile got
    none, its rows never written. The check names them unwritten."""
    base = lower(_gg(), KERNEL)
    planted = type("Floor", (GroupedLowering,), {"m_tiles": lambda self, lo, hi: (hi - lo) // self.kernel.bm})
    lw = planted(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    _, _, found, _, _ = _run(GROUPINGS["smaller-than-a-tile"], lw=lw)
    assert not found.all()


def test_a_row_mask_one_past_the_groups_end_writes_the_next_groups_first_row_twice():
    base = lower(_gg(), KERNEL)
    planted = type("Past", (GroupedLowering,), {"row_inside": lambda self, row, end: row <= end})
    lw = planted(**{f: getattr(base, f) for f in base.__dataclass_fields__})
    *_, duplicates = _run(GROUPINGS["every-group-several-tiles"], lw=lw)
    assert duplicates > 0  # a race: the last write wins (the check names it)


def test_the_rules_prove_the_grouped_kernel_and_refuse_a_ragged_k():
    m = _gg()
    plan = default_plan(m, TARGET, {}, {})
    assert plan.kernels[0].kind == "grouped"
    proof = prove(m, plan, trials=1)
    assert proof.ok, proof.certificate.failure  # type: ignore[union-attr]
    ragged = parse_text(GG.replace("40 EXTENT: #K", "36 EXTENT: #K")).models["GG"]
    assert default_plan(ragged, TARGET, {}, {}).kernels[0].kind == "general"  # the default falls back
    forced = replace(default_plan(ragged, TARGET, {}, {}), kernels=(replace(KERNEL),))
    proof = prove(ragged, forced, trials=1)
    assert not proof.ok and "vector-align" in str(proof)


@pytest.mark.parametrize("example", ["moe_qwen3_30b_a3b.habu", "moe_mixtral.habu", "moe_deepseek_v3.habu"])
def test_the_moe_examples_prove_through_grouped_kernels_at_the_witness(example):
    m = load_program(ROOT / "examples" / example).models["MOE-FFN"]
    plan = default_plan(m, TARGET, {}, {})
    # (gate+up+act, combine) on the wgmma loop (DeepSeek's too: its weights by TMA, 32-bit indices)
    want = [("grouped", "wgmma")] * 2
    assert [(k.kind, getattr(k, "main_loop", None)) for k in plan.kernels] == want
    proof = prove(m, plan, trials=1)
    assert proof.ok, proof.certificate.failure  # type: ignore[union-attr]


def test_the_grouped_kernel_compiles_with_nvrtc():
    from habu.emit_cuda.nvrtc import INCLUDE_DIR, CompilerUnavailable, compile_cuda
    from habu.paths.emit import emit_plan

    m = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    emitted = emit_plan(m, default_plan(m, TARGET, {}, {"family": "grouped"}), TARGET)  # the mma.sync loop
    k = emitted.kernels[0]
    assert "habu::mma_bf16_16816" in k.source and "habu::group_offsets" in k.source
    try:
        cubin = compile_cuda(k.source, k.name, "sm_90a", [INCLUDE_DIR])
    except CompilerUnavailable:
        pytest.skip("no NVRTC or nvcc on this machine")
    assert cubin.resources.spill_stores == 0


def test_the_search_space_holds_grouped_variants_and_the_general_fallback():
    from habu.paths import region_space
    from habu.plan.plan import GeneralKernel
    from habu.search.space import concrete_sizes

    m = _gg()
    region = default_regions(m)[0]
    space = list(region_space(m, region, TARGET, concrete_sizes(m, {})))
    grouped = [k for k in space if isinstance(k, GroupedKernel)]
    assert len(grouped) > 10 and len(set(grouped)) == len(grouped)
    assert sum(isinstance(k, GeneralKernel) for k in space) == 1
    for k in grouped:  # every variant lowers to a kernel the path supports
        lw = lower(m, k)
        assert lw.warp_rows % 16 == 0 and lw.warp_cols % 8 == 0


def test_a_runtime_number_of_groups_falls_back_to_the_general_family():
    m = parse_text(GG.replace("4 EXTENT: #G", "1..16 EXTENT: #G")).models["GG"]
    plan = default_plan(m, TARGET, {"G": 4}, {})
    assert plan.kernels[0].kind == "general"


def test_the_error_words_of_a_grouping_out_of_order_say_so():
    """habu::grouping_ok (habu/grouped/schedule.cuh) records a row holding another group's value with size 0."""
    from habu.emit_cuda import driver
    from habu.emit_cuda.device_errors import ErrorWords, describe

    words = ErrorWords("GG", "k0", (("IX", "T"), ("E", "G")), driver.Device(0, None, None, "sm_90a", 132), 0x1000)
    raw = np.array([0b10, 2, 17, 0, 1, 0, 0, 0], np.uint32)  # code 1 (E), row 17 holds group 1
    text = describe(words, raw)
    assert text is not None and text.startswith(
        "E: a grouping's values must never decrease (GROUPS:): found 1 at E[17], among the rows of another group")


def test_the_grouped_kernel_checks_each_rows_group_on_the_device():
    from habu.paths.emit import emit_plan

    m = _gg()
    source = emit_plan(m, default_plan(m, TARGET, {}, {}), TARGET).kernels[0].source
    assert "habu::grouping_ok((long long)p_E[r], (long long)g, 1u, (long long)r)" in source


def test_regression_a_grouped_plan_round_trips_through_json_and_the_search_report_names_it():
    """The search report's plan summary read a grouped kernel as a map kernel (KeyError 'threads')."""
    from habu.plan.plan import Plan
    from habu.search.report import plan_summary

    plan = default_plan(_gg(), TARGETS["sm_80"], {}, {})
    assert Plan.from_json(plan.to_json()) == plan
    assert plan_summary(plan.to_json()) == "grouped 64x64x32 w2x2"


def test_regression_a_tile_whose_chunks_outnumber_no_thread_is_refused_not_certified():
    """16 × 16 of A is 32 16-byte chunks for 64 threads: the mma.sync loop copied chunk_a = 32 // 64 = 0 of them
    (A's tile was never staged) and the plan was certified, the field check multiplying the tile as loaded.
    The copies are the lowering's now: the rule counts them and the field check routes the operands
    through them."""
    from habu.prove.rules import obligations

    m = _gg()
    bad = replace(KERNEL, bk=16)
    plan = replace(default_plan(m, TARGET, {}, {}), kernels=(bad,))
    failed = {o.rule.name for o in obligations(m, plan, SIZES) if o.formula is False}
    assert "grouped-stage-maps" in failed, failed
    mem, got, found, ref, _ = _run(GROUPINGS["inner-empty"], bad)
    assert any("no copy wrote" in f for f in mem.faults), mem.faults
    assert not np.array_equal(np.where(found, got, -1), np.where(found, ref, -1))


def test_every_mma_sync_variant_routes_its_operands_as_the_tile_product():
    """The search's mma.sync tiles: each one's copies, operand words and accumulator map (habu/lower/grouped_mma.py)
    run by the field check's route are the plain tile product, and a planted map is not."""
    from habu.bench.mutant_plants import a_word_rows_swapped, accumulator_halves_swapped, copy_turn_shifted
    from habu.paths import grouped
    from habu.prove.grouped_route import epilogue_moves, grouped_mma_route

    loops = {lower(_gg(), k).mma for k in grouped.PATH.variants(KERNEL, TARGETS["sm_80"])}
    assert len(loops) > 10
    for loop in loops:
        route = grouped_mma_route(loop)
        assert route.identity and not route.faults and epilogue_moves(loop) is None, (loop, route.faults)
    loop = lower(_gg(), KERNEL).mma
    assert not grouped_mma_route(a_word_rows_swapped(loop)).identity
    assert grouped_mma_route(copy_turn_shifted(loop)).faults
    assert epilogue_moves(accumulator_halves_swapped(loop)) is not None


def test_regression_a_moe_layer_of_64_bit_indices_keeps_the_mma_sync_loop_by_default():
    """A layer whose wgmma kernels would need 64-bit offsets spills there (168 registers, 160 B; the
    every-example compile test failed on the merged tree), so its default is the mma.sync grouped loop (102
    registers, no spill): DeepSeek-V3 with a hidden width of 16384 (act: 262144 × 16384 elements). DeepSeek's
    own default (32-bit on the wgmma loop: only its weights pass 2^31, and TMA loads them) and Mixtral's keep
    the wgmma loop."""
    path = ROOT / "examples" / "moe_deepseek_v3.habu"
    deepseek = load_program(path).models["MOE-FFN"]
    assert {(k.main_loop, k.index_width) for k in default_plan(deepseek, TARGET, {}, {}).kernels} == {("wgmma", 32)}
    wide = parse_text(path.read_text().replace("2048 EXTENT: #H", "16384 EXTENT: #H")).models["MOE-FFN"]
    plan = default_plan(wide, TARGET, {}, {})
    assert {(getattr(k, "main_loop", None), k.index_width) for k in plan.kernels} == {("mma.sync", 64), (None, 64)}
    mixtral = load_program(ROOT / "examples" / "moe_mixtral.habu").models["MOE-FFN"]
    assert {getattr(k, "main_loop", None) for k in default_plan(mixtral, TARGET, {}, {}).kernels} == {"wgmma"}


def test_deepseek_on_the_wgmma_loop_takes_32_bit_indices_and_proves_at_a_reduced_witness():
    """DeepSeek-V3's weights pass 2^31 elements but the wgmma loop loads them by TMA coordinates: its kernels
    form every other offset in 32 bits (no spill: 168 registers, none spilled; 64-bit ones spilled), the
    rules check W in 64 bits and its box coordinates in 32, and the witness reduces W's extents (nothing of
    W wraps in the kernel) — 3 s where the full shape took minutes."""
    from habu.prove.interp_grouped import _offset_tensors

    m = load_program(ROOT / "examples" / "moe_deepseek_v3.habu").models["MOE-FFN"]
    sizes = {"T": 16, "R": 128}
    model = m.with_sizes(sizes)
    plan = default_plan(model, TARGET, sizes, {"family": "grouped", "main_loop": "wgmma", "pair": "fused"})
    assert [(k.main_loop, k.index_width) for k in plan.kernels] == [("wgmma", 32), ("wgmma", 32)]
    lowered = lower_plan(model, plan)
    assert all(lw.weights_width == 64 for lw in lowered)
    assert "W1" not in _offset_tensors(lowered[0]) and "X" in _offset_tensors(lowered[0])
    proof = prove(model, plan, sizes, trials=1)
    assert proof.ok, proof.certificate.failure  # type: ignore[union-attr]
    assert any("TMA box coordinates" in o.describe() for o in proof.obligations)
    w = proof.certificate.witness  # type: ignore[union-attr]
    assert w is not None and w["E"] < 256 and w["D"] < 7168


def test_mutant_w_offsets_formed_in_32_bits_on_the_wgmma_loop_at_deepseeks_size_is_refused(monkeypatch):
    """The mutant of `weights_width`: a wgmma kernel forming W's offsets in its 32-bit index width (as the
    mma.sync loop does) wraps past 2^31 elements; the int32 rule names W1 (W3, W2) and the plan is refused."""
    from habu.prove.rules import failures, obligations

    m = load_program(ROOT / "examples" / "moe_deepseek_v3.habu").models["MOE-FFN"]
    sizes = {"T": 16, "R": 128}
    model = m.with_sizes(sizes)
    plan = default_plan(model, TARGET, sizes, {"family": "grouped", "main_loop": "wgmma", "pair": "fused"})
    assert not failures(obligations(model, plan, sizes))
    monkeypatch.setattr(GroupedLowering, "weights_width", property(lambda lw: lw.index_width))
    broken = failures(obligations(model, plan, sizes))
    assert {o.tensor for o in broken if "32-bit offsets" in o.describe()} == {"W1", "W3", "W2"}


def test_a_small_batch_takes_64_row_tiles_of_one_consumer_warpgroup():
    """At most 64 routed rows an expert on average (Mixtral at 128 tokens: 32): the pair and the combine in
    64-row tiles (faster at 16 tokens on the H200: 1.62x against 1.57x the best torch baseline); at 4096
    tokens (1024 an expert) 128-row tiles of two consumer warpgroups."""
    m = load_program(ROOT / "examples" / "moe_mixtral.habu").models["MOE-FFN"]
    for tokens, bm, warps_m in ((128, 64, 1), (4096, 128, 2)):
        sizes = {"T": tokens, "R": 2 * tokens}
        plan = default_plan(m.with_sizes(sizes), TARGET, sizes, {})
        assert {(k.main_loop, k.bm, k.warps_m) for k in plan.kernels} == {("wgmma", bm, warps_m)}
