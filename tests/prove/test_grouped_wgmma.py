"""The grouped GEMM's wgmma main loop (habu/lower/grouped_wgmma.py): its band tile order, TMA box origins,
mbarrier ring and stage maps executed over GF(p) for hand-made groupings (empty groups, a group longer than
a tile, one group holding every row), planted bugs the check kills, its rules, the `--pin main_loop=wgmma`
plans of the MoE model, the search's variants, and NVRTC where it is available."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from habu.errors import UsageError
from habu.lower import GroupedLowering, lower
from habu.lower.grouped_wgmma import WgmmaMainLoop
from habu.plan.plan import GroupedKernel
from habu.prove.interp import Memory
from habu.prove.interp_grouped import grid_blocks, run_grouped
from habu.prove.rules import obligations
from habu.prove.verify import virtual_inputs
from habu.search.space import default_plan
from habu.spec.field import PrimeField
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.prove.test_grouped import FixedGrouping

TARGET = TARGETS["sm_90a"]
GG = """200 EXTENT: #R  30 EXTENT: #T  4 EXTENT: #G  40 EXTENT: #N  136 EXTENT: #K
bf16 TENSOR: X ( #T #K )  bf16 TENSOR: W ( #G #N #K )  f32 TENSOR: Y ( #R #N )
ITENSOR: IX ( #R #T )  GROUPS: E ( #R #G )
MODEL: GG
   Y[r n] = Σ k X[IX[r] k] · W[E[r] n k] ;
"""
GGF = GG.replace("bf16 TENSOR: X", "f32 TENSOR: X")  # an f32 A, gathered: two bf16 parts on the tensor cores
SIZES = {"R": 200, "T": 30, "G": 4, "N": 40, "K": 136}
# one consumer warpgroup of 64 rows, 3 k tiles (the last ragged) through a ring of 2 stages
KERNEL = GroupedKernel(nodes=("Y",), bm=64, bn=64, bk=64, warps_m=1, warps_n=4, main_loop="wgmma", stages=2)
GROUPINGS = {  # 200 rows into 4 groups; tiles of 64 rows
    "first-and-last-empty-one-longer-than-two-tiles": [1] * 150 + [2] * 50,
    "inner-empty-ragged": [0] * 65 + [2] * 70 + [3] * 65,
    "one-group-holds-every-row": [3] * 200,
}


def _gg():
    return parse_text(GG).models["GG"]


def _run(values: list[int], lw: GroupedLowering | None = None, source: str = GG):
    """Every block of the grid over GF(p) with the grouping `values`: (faults, got, written, reference, twice).
    `source`: the model's text (GGF: its A in f32)."""
    model = parse_text(source).models["GG"]
    lw = lw or lower(model, KERNEL)
    assert isinstance(lw, GroupedLowering) and lw.wgmma is not None
    field = PrimeField(seed=5)
    inputs = virtual_inputs(model, SIZES, field, 5)
    inputs["E"] = FixedGrouping(values, SIZES["G"])
    mem = Memory(inputs, field, SIZES)
    run_grouped("k0", lw, SIZES, mem, grid_blocks(lw, SIZES))
    R, N, K = SIZES["R"], SIZES["N"], SIZES["K"]
    ix = inputs["IX"].at(np.arange(R))
    x = inputs["X"][ix[:, None], np.arange(K)[None, :]]
    w = inputs["W"][np.asarray(values)[:, None, None], np.arange(N)[None, :, None], np.arange(K)[None, None, :]]
    ref = np.einsum("rk,rnk->rn", x.astype(object), w.astype(object)) % field.p
    written = mem.written.get("Y")
    got, found = written.read(np.arange(R * N)) if written is not None else (np.zeros(R * N, np.int64),
                                                                              np.zeros(R * N, bool))
    dup, _ = written.multiply_written() if written is not None else (np.zeros(0), None)
    return mem.faults, got.reshape(R, N), found.reshape(R, N), ref.astype(np.int64), len(dup)


def _planted(base: GroupedLowering, **methods) -> GroupedLowering:
    cls = type("Planted", (GroupedLowering,), methods)
    return cls(**{f: getattr(base, f) for f in base.__dataclass_fields__})


@pytest.mark.parametrize("name", list(GROUPINGS))
def test_the_wgmma_loop_writes_every_row_once_with_its_groups_weights(name):
    faults, got, found, ref, twice = _run(GROUPINGS[name])
    assert not faults, faults
    assert found.all() and twice == 0
    np.testing.assert_array_equal(got, ref)


def test_the_band_order_gives_every_tile_one_block():
    lw = lower(_gg(), replace(KERNEL, bm=64))
    big = {**SIZES, "R": 5000, "N": 1000}  # 82 row tiles (bands of 8, the last ragged) × 16 column tiles
    blocks = grid_blocks(lw, big)
    gx, gy = (int(x) for x in lw.grid(big))
    assert sorted(blocks) == [(mt, nt) for mt in range(gx) for nt in range(gy)]
    assert blocks[:3] == [(0, 0), (1, 0), (2, 0)] and blocks[8] == (0, 1)  # m fastest within a band


def test_regression_a_box_one_group_off_multiplies_the_next_groups_weights():
    base = lower(_gg(), KERNEL)
    assert isinstance(base, GroupedLowering) and base.wgmma is not None
    shifted = type("Shifted", (WgmmaMainLoop,), {
        "w_box_origin": lambda self, g, n0, k0, box=0: {"g": g + 1, "n": n0, "k": k0}})
    loop = shifted(**{f: getattr(base.wgmma, f) for f in base.wgmma.__dataclass_fields__})
    _, got, _, ref, _ = _run(GROUPINGS["inner-empty-ragged"], replace(base, wgmma=loop))
    assert (got != ref).any()


def test_regression_a_row_mask_dropped_at_the_groups_end_writes_the_next_groups_rows_twice():
    base = lower(_gg(), KERNEL)
    _, got, _, ref, twice = _run(GROUPINGS["inner-empty-ragged"], _planted(base, row_inside=lambda self, row, end: row < row + 1))
    assert twice > 0 or (got != ref).any()


def test_regression_a_ring_that_wraps_one_stage_late_is_a_fault():
    base = lower(_gg(), KERNEL)
    assert isinstance(base, GroupedLowering) and base.wgmma is not None
    ring = replace(base.wgmma.ring, wrap=base.wgmma.ring.stages + 1)
    faults, *_ = _run(GROUPINGS["inner-empty-ragged"], replace(base, wgmma=replace(base.wgmma, ring=ring)))
    assert any("pipeline" in f for f in faults), faults


@pytest.mark.parametrize(("change", "rule"), [
    ({"bk": 32}, "supported-path"),  # a k tile is one 128-byte swizzle span
    ({"stages": 1}, "supported-path"),  # a ring of one stage deadlocks
    ({"bn": 256, "bm": 128, "warps_m": 2, "stages": 6}, "smem-budget"),  # 6 × 48 KiB
])
def test_the_rules_refuse_what_the_wgmma_loop_cannot_run(change, rule):
    m = _gg()
    plan = replace(default_plan(m, TARGET, {}, {}), kernels=(replace(KERNEL, **change),))
    failed = {o.rule.name for o in obligations(m, plan, SIZES) if o.formula is False}
    assert rule in failed, failed


def test_the_wgmma_pin_takes_gate_up_and_the_combine_and_refuses_a_target_without_wgmma():
    m = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    plan = default_plan(m, TARGET, {}, {"family": "grouped", "main_loop": "wgmma"})
    assert [(k.kind, getattr(k, "main_loop", None)) for k in plan.kernels] == [
        ("grouped", "wgmma"), ("grouped", "wgmma"), ("rows", None), ("grouped", "wgmma")]
    assert plan.kernels[-1].stages == 6  # act is bf16: the combine's A by cp.async, 6 stages of 32 KiB
    f32 = load_program(ROOT / "tests" / "data" / "grouped_scatter.habu").models["COMBINE-F32"]
    split = default_plan(f32, TARGET, {}, {"family": "grouped", "main_loop": "wgmma"})
    assert [(k.main_loop, k.bn, k.stages) for k in split.kernels] == [("wgmma", 128, 4)]  # an f32 A: 48 KiB a stage
    paired = default_plan(m, TARGET, {}, {"family": "grouped", "pair": "fused", "main_loop": "wgmma"})
    assert [(len(k.nodes), k.main_loop, k.bn) for k in paired.kernels] == [(3, "wgmma", 128), (1, "wgmma", 128)]
    with pytest.raises(UsageError, match="main_loop=wgmma"):
        default_plan(m, TARGETS["sm_80"], {}, {"family": "grouped", "main_loop": "wgmma"})


def test_the_search_space_holds_wgmma_variants():
    from habu.paths import grouped

    base = lower(_gg(), KERNEL).kernel
    loops = {(k.main_loop, k.bm, k.bn) for k in grouped.PATH.variants(base, TARGET)}
    assert ("wgmma", 128, 256) in loops and ("mma.sync", 64, 64) in loops
    assert not any(k.main_loop == "wgmma" for k in grouped.PATH.variants(base, TARGETS["sm_80"]))


def test_the_wgmma_kernel_compiles_with_nvrtc_without_spills():
    from habu.paths.emit import emit_plan

    kernels = []
    for file, name in (("moe_small.habu", "MOE-FFN"), ("grouped_scatter.habu", "COMBINE-F32")):
        m = load_program(ROOT / "tests" / "data" / file).models[name]
        kernels.append(emit_plan(m, default_plan(m, TARGET, {}, {"family": "grouped", "main_loop": "wgmma"}),
                                 TARGET).kernels[-1])
    for k in kernels:  # the bf16-A combine by cp.async (vector atomics); an f32 A in two bf16 parts
        assert "habu::tma_load_3d" in k.source and "wgmma" in k.source
        assert_compiles_without_spills(k)


def assert_compiles_without_spills(kernel) -> None:
    """NVRTC (or nvcc) compiles the kernel for sm_90a with no spills; skipped where neither is available."""
    from habu.emit_cuda.nvrtc import INCLUDE_DIR, CompilerUnavailable, compile_cuda

    try:
        cubin = compile_cuda(kernel.source, kernel.name, "sm_90a", [INCLUDE_DIR])
    except CompilerUnavailable:
        pytest.skip("no NVRTC or nvcc on this machine")
    assert cubin.resources.spill_stores == 0


def test_regression_a_pairs_second_box_read_where_the_first_landed_is_a_fault():
    """The fused gate/up kernel on the wgmma loop: the second weights' box lands b2_offset bytes into the
    stage's B tile and the consumers read them from row bn; a box landing elsewhere is named."""
    from habu.lower import lower_plan
    from habu.prove.verify import verify_plan

    m = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    shape = {"T": 13, "R": 26}
    model = m.with_sizes(shape)
    plan = default_plan(model, TARGET, shape, {"family": "grouped", "pair": "fused", "main_loop": "wgmma"})
    lowerings = lower_plan(model, plan)
    assert verify_plan(model, plan, shape, trials=1, lowerings=lowerings).passed
    pair = lowerings[0]
    assert isinstance(pair, GroupedLowering) and pair.wgmma is not None
    lowerings[0] = replace(pair, wgmma=replace(pair.wgmma, b2_offset=0))
    cert = verify_plan(model, plan, shape, trials=1, lowerings=lowerings)
    assert not cert.passed and "second weights" in (cert.failure or "")


@pytest.mark.parametrize("tile", [{}, {"bm": 128, "bn": 128, "warps_m": 2, "stages": 3}])
@pytest.mark.parametrize("name", list(GROUPINGS))
def test_an_f32_a_split_by_the_consumers_in_place_is_the_product(name, tile):
    """`a_split` consumers: the producer copies A's f32 chunks raw (two 16-byte halves, `a_landed_offset`) into the
    bytes its parts take, each consumer warpgroup splits its slab there before its wgmmas; the check runs the
    copies' and the split's maps (`split_pass_faults`) and the product."""
    lw = lower(parse_text(GGF).models["GG"], replace(KERNEL, a_split="consumers", **tile))
    assert isinstance(lw, GroupedLowering) and lw.wgmma is not None and lw.wgmma.a_convert
    faults, got, found, ref, twice = _run(GROUPINGS[name], lw, GGF)
    assert not faults, faults
    assert found.all() and twice == 0 and (got == ref).all()


@pytest.mark.parametrize("planted", [
    # the producer copies a chunk's halves into each other's units
    {"a_landed_offset": lambda self, i, k, half=0: WgmmaMainLoop.a_landed_offset(self, i, k, 1 - half)},
    # consumer threads on rows strided by 32: half a slab's rows split twice, half never
    {"convert_source": lambda self, t, j: ((t + 128 * j) % 32, ((t + 128 * j) // 64) * 8)},
    # the raw units not swizzled by the row: the consumers read other chunks
    {"a_staged_offset": lambda self, i, k, half: (((k // 4 + half) // 8) * self.lo_offset + i * 128
                                                  + ((k // 4 + half) % 8) * 16) if half < 2 else 0,
     "a_landed_offset": lambda self, i, k, half=0: WgmmaMainLoop.a_staged_offset(self, i, k, half)},
    # the halves' floats swapped in the row: the consumers split k + 4..7 as k..k + 3
    {"half_source": lambda self, half: 4 * (1 - half)},
    # each row's raw floats staged one row down: a warpgroup's last row lands in the other's slab
    {"a_landed_offset": lambda self, i, k, half=0: WgmmaMainLoop.a_staged_offset(self, (i + 1) % 128, k, half),
     "a_staged_offset": lambda self, i, k, half: WgmmaMainLoop.a_staged_offset(self, (i + 1) % 128, k, half)},
])
def test_regression_a_planted_split_pass_is_killed(planted):
    base = lower(parse_text(GGF).models["GG"], replace(KERNEL, bm=128, bn=64, warps_m=2, a_split="consumers"))
    assert isinstance(base, GroupedLowering) and base.wgmma is not None
    loop = base.wgmma
    cls = type("Planted", (WgmmaMainLoop,), planted)
    faults, got, _, ref, _ = _run(GROUPINGS["inner-empty-ragged"],
                                  replace(base, wgmma=cls(**{f: getattr(loop, f) for f in loop.__dataclass_fields__})), GGF)
    assert faults or not (got == ref).all()


def test_the_default_splits_an_f32_a_in_the_consumers_and_the_search_tries_both():
    from habu.paths.emit import emit_plan

    f32 = load_program(ROOT / "tests" / "data" / "grouped_scatter.habu").models["COMBINE-F32"]
    plan = default_plan(f32, TARGET, {}, {"family": "grouped", "main_loop": "wgmma"})
    assert plan.kernels[0].a_split == "consumers"
    src = emit_plan(f32, plan, TARGET).kernels[0].source
    assert "habu::slab_pass_sync(1 + cw);" in src and "habu::store_split_bf16x8(at, at + " in src
    assert "__ldg" not in src and "const float4* src" not in src  # no register loads of A
    assert_compiles_without_spills(emit_plan(f32, plan, TARGET).kernels[0])
    from habu.paths import grouped
    from habu.plan.patterns import Region

    f32_gg = parse_text(GGF).models["GG"]
    base = lower(f32_gg, KERNEL).kernel
    splits = {k.a_split for k in grouped.PATH.region_variants(f32_gg, Region("grouped", ("Y",)), base, TARGET, SIZES)
              if k.main_loop == "wgmma"}
    assert splits == {"consumers", "producer"}


def test_regression_an_f32_a_kernel_without_setmaxnreg_asks_no_register_demand():
    """The f32-A producer keeps its launch registers (no setmaxnreg): a register demand equal to the full
    pool would refuse the kernel whenever ptxas gives it a few registers less (166 of 168)."""
    from habu.paths.emit import emit_plan

    m = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    gate = emit_plan(m, default_plan(m, TARGET, {}, {"family": "grouped", "main_loop": "wgmma"}), TARGET).kernels[0]
    f32 = load_program(ROOT / "tests" / "data" / "grouped_scatter.habu").models["COMBINE-F32"]
    combine = emit_plan(f32, default_plan(f32, TARGET, {}, {"family": "grouped", "main_loop": "wgmma"}), TARGET).kernels[0]
    assert "setmaxnreg_inc<232>" in gate.source and gate.register_demand
    assert "setmaxnreg" not in combine.source.replace("no setmaxnreg", "") and combine.register_demand is None
    combine.check_registers(166)


def test_regression_an_f32_a_kernel_of_eight_warps_asks_no_setmaxnreg():
    """At 8 warps (bm 64: one consumer warpgroup) the f32-A split kept the producer at the launch's 248 registers
    and sent the consumer `inc` to 232, fewer than it launched with: ptxas gave the kernel 232, the demand
    128 × (248 + 232) exceeded 256 × 232 and the runtime refused the kernel on the H200 (2026-12-02,
    tests/gpu/test_grouped_wgmma.py's f32 test). Both keep the launch's count: no setmaxnreg."""
    from habu.paths.emit import emit_plan

    f32 = load_program(ROOT / "tests" / "data" / "grouped_scatter.habu").models["COMBINE-F32"]
    sizes = {"T": 50, "R": 300}
    model = f32.with_sizes(sizes)
    plan = default_plan(model, TARGET, sizes, {"family": "grouped", "main_loop": "wgmma"})
    kernel = emit_plan(model, plan, TARGET).kernels[0]
    assert kernel.threads == 256
    assert "setmaxnreg" not in kernel.source.replace("no setmaxnreg", "") and kernel.register_demand is None
    kernel.check_registers(232)


def test_a_pair_by_one_instruction_is_proven_and_its_halves_are_where_the_lowering_says():
    """`pair_wgmmas=1`: gate and up by one n = 2·bn wgmma over both weights' boxes (the second box's columns
    are the accumulator's second half, `WgmmaMainLoop.pair_group`); the check passes, and reading the halves
    the other way round (SwiGLU of up times gate) is a wrong value it names."""
    from habu.bench.mutant_plants import pair_halves_swapped
    from habu.lower import lower_plan
    from habu.paths.emit import emit_plan
    from habu.prove.verify import verify_plan

    m = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    shape = {"T": 13, "R": 26}
    model = m.with_sizes(shape)
    plan = default_plan(model, TARGET, shape, {"family": "grouped", "pair": "fused", "main_loop": "wgmma",
                                               "pair_wgmmas": "1"})
    lowerings = lower_plan(model, plan)
    loop = lowerings[0].wgmma
    assert loop is not None and loop.one_pair_instruction and loop.mma_columns == 2 * plan.kernels[0].bn
    assert verify_plan(model, plan, shape, trials=1, lowerings=lowerings).passed
    source = emit_plan(model, plan, TARGET).kernels[0].source
    assert f"habu_wgmma_m64n{2 * plan.kernels[0].bn}_bf16(acc[0]" in source and "acc2" not in source
    lowerings[0] = pair_halves_swapped(lowerings[0])
    cert = verify_plan(model, plan, shape, trials=1, lowerings=lowerings)
    assert not cert.passed and "differs" in (cert.failure or "")


@pytest.mark.parametrize("instructions", ["2", "1"])
def test_the_16_byte_epilogue_is_proven_and_a_wrong_slot_is_named(instructions):
    """`store_vector=8` on the pair's bf16 output: the 4 lanes of a row trade their column pairs
    (habu/lower/quad_vectors.py) and store 8 columns at once; the check runs the trade (`vector_moves`) and
    kills a slot one place off; the kernel compiles without spills."""
    from habu.bench.mutant_plants import vector_slot_one_off
    from habu.lower import lower_plan
    from habu.paths.emit import emit_plan
    from habu.prove.verify import verify_plan

    m = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    shape = {"T": 150, "R": 300}
    model = m.with_sizes(shape)
    plan = default_plan(model, TARGET, shape, {"family": "grouped", "pair": "fused", "main_loop": "wgmma",
                                               "pair_wgmmas": instructions, "store_vector": "8", "bm": "128",
                                               "warps_m": "2"})
    lowerings = lower_plan(model, plan)
    qv = lowerings[0].epilogue_vectors
    assert qv is not None and qv.elements == 8
    assert verify_plan(model, plan, shape, trials=1, lowerings=lowerings).passed

    lowerings[0] = vector_slot_one_off(lowerings[0])
    cert = verify_plan(model, plan, shape, trials=1, lowerings=lowerings)
    assert not cert.passed and "differs" in (cert.failure or "")
    kernel = emit_plan(model, plan, TARGET).kernels[0]
    assert "habu::store_words<4>" in kernel.source and "__shfl_xor_sync" in kernel.source
    assert_compiles_without_spills(kernel)


@pytest.mark.parametrize("method", ["sent_group", "slot", "offset", "vector_column", "row", "lane_in_group",
                                    "position"])
def test_every_map_the_16_byte_epilogue_prints_is_one_the_check_runs(method):
    """Each of the trade's maps (`QuadVectors`: what a lane sends, the slot a pair fills, the shuffle's xor, the
    vector's column and row, the lane's place, an element's place), planted one off in the grouped lowering's
    `epilogue_vectors`, changes the printed kernel and is caught by the field check. Regression: a lane sending
    a group past the accumulator's last (`sent_group` + 1, `lane_in_group` + 1) raised IndexError in the check
    instead of naming the fault."""
    from habu.bench.derived_lines import _with_property
    from habu.bench.derived_plants_attention import VECTOR_PLANTS, planted_vectors
    from habu.lower import lower_plan, lower_whole
    from habu.paths.emit import emit_lowered
    from habu.prove.verify import verify_plan

    m = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    shape = {"T": 150, "R": 300}
    model = m.with_sizes(shape)
    plan = default_plan(model, TARGET, shape, {"family": "grouped", "pair": "fused", "main_loop": "wgmma",
                                               "store_vector": "8", "bm": "128", "warps_m": "2"})
    lowerings = lower_plan(model, plan)
    planted = dict(VECTOR_PLANTS)[method]
    bad = _with_property(lowerings[0], "epilogue_vectors", lambda qv: planted_vectors(qv, method, planted))
    whole = lower_whole(model, plan)
    printed = emit_lowered(whole, plan, TARGET).kernels[0].source
    moved = emit_lowered(replace(whole, kernels=(bad, *whole.kernels[1:])), plan, TARGET).kernels[0].source
    assert moved != printed
    lowerings[0] = bad
    cert = verify_plan(model, plan, shape, trials=1, lowerings=lowerings)
    assert not cert.passed
