"""A grouped GEMM whose weights are stored n-major, `W[E[r] k n]` (a backward's product through the transposed
expert weights: `dTact[r h] = Σ d dY[IX[r] d] · P[r] · W2[E[r] d h]`): the wgmma loop reads W in 64-column TMA
boxes with the instruction's transpose bit; the mma.sync loop cannot (it stages 16-byte chunks along k) and the
rules say so. Each box's origin, landing and the descriptors are executed over GF(p); planted bugs are killed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from habu.lower import GroupedLowering, lower
from habu.lower.grouped_wgmma import WgmmaMainLoop
from habu.plan.plan import GroupedKernel
from habu.prove.interp import Memory
from habu.prove.interp_grouped import grid_blocks, run_grouped
from habu.prove.rules import failures, obligations
from habu.prove.verify import virtual_inputs
from habu.search.space import default_plan
from habu.spec.field import PrimeField
from habu.spec.parser import parse_text
from habu.target import TARGETS
from tests.prove.test_grouped import FixedGrouping

TARGET = TARGETS["sm_90a"]
# #N 200: two 128-column tiles, the second's second box wholly past #N (TMA fills it with zeros)
GG = """200 EXTENT: #R  30 EXTENT: #T  4 EXTENT: #G  200 EXTENT: #N  136 EXTENT: #K
f32 TENSOR: X ( #T #K )  bf16 TENSOR: W ( #G #K #N )  f32 TENSOR: Y ( #R #N )  f32 TENSOR: P ( #R )
ITENSOR: IX ( #R #T )  GROUPS: E ( #R #G )
MODEL: GG-T
   Y[r n] = Σ k X[IX[r] k] · P[r] · W[E[r] k n] ;
"""
SIZES = {"R": 200, "T": 30, "G": 4, "N": 200, "K": 136}
KERNEL = GroupedKernel(nodes=("Y",), bm=64, bn=128, bk=64, warps_m=1, warps_n=4, main_loop="wgmma", stages=3)
GROUPING = [0] * 65 + [2] * 70 + [3] * 65  # group 1 empty, groups ragged against 64-row tiles


def _gg():
    return parse_text(GG).models["GG-T"]


def _run(lw: GroupedLowering | None = None):
    """Every block over GF(p): (faults, got, reference)."""
    model = _gg()
    lw = lw or lower(model, KERNEL)
    assert isinstance(lw, GroupedLowering) and lw.wgmma is not None
    field = PrimeField(seed=11)
    inputs = virtual_inputs(model, SIZES, field, 11)
    inputs["E"] = FixedGrouping(GROUPING, SIZES["G"])
    mem = Memory(inputs, field, SIZES)
    run_grouped("k0", lw, SIZES, mem, grid_blocks(lw, SIZES))
    R, N, K = SIZES["R"], SIZES["N"], SIZES["K"]
    ix = inputs["IX"].at(np.arange(R))
    x = inputs["X"][ix[:, None], np.arange(K)[None, :]].astype(object)
    p = inputs["P"].at(np.arange(R)).astype(object)
    w = inputs["W"][np.asarray(GROUPING)[:, None, None], np.arange(K)[None, :, None], np.arange(N)[None, None, :]]
    ref = (np.einsum("rk,rkn->rn", x, w.astype(object)) * p[:, None]) % field.p
    got, _ = mem.written["Y"].read(np.arange(R * N))
    return mem.faults, got.reshape(R, N), ref.astype(np.int64)


def _loop_with(base: GroupedLowering, **methods) -> GroupedLowering:
    assert base.wgmma is not None
    cls = type("Planted", (WgmmaMainLoop,), methods)
    return replace(base, wgmma=cls(**{f: getattr(base.wgmma, f) for f in base.wgmma.__dataclass_fields__}))


def test_an_n_major_w_is_read_in_64_column_boxes_and_the_product_is_exact():
    lw = lower(_gg(), KERNEL)
    assert isinstance(lw, GroupedLowering) and lw.w_n_major and lw.wgmma is not None
    assert lw.wgmma.w_boxes == 2 and lw.wgmma.w_box(lw.w) == (64, 64, 1)  # n, k, g innermost first
    assert lw.wgmma.operands.b_desc.mn_major
    faults, got, ref = _run(lw)
    assert not faults, faults
    np.testing.assert_array_equal(got, ref)


def test_regression_every_box_at_the_tiles_first_column_is_wrong():
    base = lower(_gg(), KERNEL)
    assert isinstance(base, GroupedLowering)
    planted = _loop_with(base, w_box_origin=lambda self, g, n0, k0, box=0: {"g": g, "n": n0, "k": k0})
    faults, got, ref = _run(planted)
    assert faults or (got != ref).any()


def test_regression_a_box_landing_on_the_others_bytes_is_a_fault():
    base = lower(_gg(), KERNEL)
    assert isinstance(base, GroupedLowering) and base.wgmma is not None
    load = base.wgmma.w_load
    ring = replace(base.wgmma.ring, loads=tuple(replace(ld, box_rows=ld.box_rows // 2) if ld.side == "B" else ld
                                                for ld in base.wgmma.ring.loads))
    faults, _, _ = _run(replace(base, wgmma=replace(base.wgmma, ring=ring)))
    assert load.box_rows == 64 and any("TMA box" in f for f in faults), faults


def test_regression_a_k_major_descriptor_over_the_n_major_tile_is_a_fault():
    """The instruction's transpose bit is printed from the lowering's descriptor: one that says K-major over
    the 64-column blocks routes the wrong elements, and the check says so."""
    base = lower(_gg(), KERNEL)
    assert isinstance(base, GroupedLowering) and base.wgmma is not None
    ops = base.wgmma.operands
    planted = replace(base, wgmma=replace(base.wgmma, operands=replace(ops, b_desc=replace(ops.b_desc, mn_major=False))))
    faults, _, _ = _run(planted)
    assert faults


def test_the_rules_refuse_an_n_major_w_on_the_mma_sync_loop_and_in_partial_boxes():
    m = _gg()
    for kernel, why in ((replace(KERNEL, main_loop="mma.sync", bm=64, bn=64, bk=32, warps_m=2, warps_n=2, stages=1),
                         "only the wgmma loop reads"),
                        (replace(KERNEL, bn=32), "whole boxes")):
        plan = replace(default_plan(m, TARGET, {}, {}), kernels=(kernel,))
        failed = [o for o in obligations(m, plan, SIZES) if o.formula is False]
        assert any(o.rule.name == "supported-path" and why in o.detail for o in failed), [o.detail for o in failed]


def test_the_rules_refuse_an_n_major_w_whose_rows_are_not_whole_16_byte_chunks():
    m = parse_text(GG.replace("200 EXTENT: #N", "196 EXTENT: #N").replace("GG-T", "ODD")).models["ODD"]
    plan = replace(default_plan(_gg(), TARGET, {}, {}), kernels=(KERNEL,))
    bad = failures(obligations(m, plan, {**SIZES, "N": 196}))
    assert [(o.rule.name, o.tensor) for o in bad] == [("tma-stride-16B", "W")]
    assert "392 bytes" in bad[0].detail


def test_the_default_plan_takes_the_wgmma_loop_and_sm_80_the_general_family():
    m = _gg()
    kernels = default_plan(m, TARGET, {}, {}).kernels
    assert [(k.kind, getattr(k, "main_loop", None)) for k in kernels] == [("grouped", "wgmma")]
    assert [k.kind for k in default_plan(m, TARGETS["sm_80"], {}, {}).kernels] == ["general"]


def test_the_n_major_kernel_prints_its_boxes_and_the_transpose_bit_and_compiles():
    from habu.paths.emit import emit_plan
    from tests.prove.test_grouped_wgmma import assert_compiles_without_spills

    m = _gg()
    kernel = emit_plan(m, default_plan(m, TARGET, {}, {}), TARGET).kernels[0]
    assert kernel.source.count("habu::tma_load_3d(b_stage") == 2 and "b_stage + 8192u" in kernel.source
    assert "_bf16_bt(" in kernel.source  # wgmma with B's transpose bit
    assert_compiles_without_spills(kernel)


def test_the_moe_backwards_first_product_takes_the_grouped_wgmma_loop():
    """`dTact[r h] = Σ d dY[IX[r] d] · P[r] · W2[E[r] d h]`: the MoE layer's backward through the down
    projection's weights, n-major, is proven on the grouped wgmma loop."""
    from habu.compile import bind_shape
    from habu.lower import lower_plan
    from habu.prove.verify import verify_plan
    from habu.spec.grad_program import derive_model
    from habu.spec.parser import load_program
    from tests.conftest import ROOT

    bw = derive_model(load_program(ROOT / "tests" / "data" / "moe_small.habu"), "MOE-FFN")
    shape = {"T": 13, "R": 26}
    model = bind_shape(bw.model, shape)
    plan = default_plan(model, TARGET, shape, {})
    first = next(k for k in plan.kernels if "dact" in " ".join(k.nodes))
    assert first.kind == "grouped" and first.main_loop == "wgmma"
    assert verify_plan(model, plan, shape, trials=1, lowerings=lower_plan(model, plan)).passed


def test_the_search_space_of_an_n_major_gemm_holds_only_the_wgmma_loops_whole_boxes():
    from habu.paths import grouped
    from habu.plan.patterns import Region

    m = _gg()
    base = default_plan(m, TARGET, {}, {}).kernels[0]
    ks = list(grouped.PATH.region_variants(m, Region("general", ("Y",)), base, TARGET, SIZES))
    assert ks and all(k.main_loop == "wgmma" and k.bn % 64 == 0 for k in ks)
