"""A product that reads one tensor as both operands, over one extent (the Gram matrix O = A·Aᵀ: m and n both over
#M; a square matrix times itself, S·S). Found in session 58: with unequal tiles along m and n the Gram matrix's
default plan failed the field check ("O[0, 128] was never written": the check's sample box took the m tiles' rows
for both of O's dims, as both are over #M); and the emitter gave both operands one tensor map, the first one's box,
so S·S (A k-major, B n-major: two boxes) was proven and printed with B's loads through A's map: certified and
wrong."""

from __future__ import annotations

import re

import pytest

from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
DATA = ROOT / "tests" / "data" / "one_operand_twice.habu"


def _gram():
    return load_program(DATA).models["GRAM"]


@pytest.mark.parametrize("pins", [{}, {"tile": "64x256x64"}, {"A": "cp.async", "B": "cp.async"},
                                  {"store": "direct"}, {"mma": "mma.sync", "tile": "128x64x32"}])
def test_a_gram_matrix_with_unequal_tiles_is_proven(pins):
    model = _gram()
    plan = default_plan(model, T, {}, pins)
    k = plan.kernels[0]
    assert k.tile_m != k.tile_n, k
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, ([v.describe() for v in proof.violations], proof.certificate and proof.certificate.failure)


def test_one_tensor_read_in_two_boxes_gets_a_tensor_map_for_each():
    model = _gram()
    plan = default_plan(model, T, {})  # 128 × 64 tiles: A's box is 128 rows, B's 64
    kernel = emit_plan(model, plan, T).kernels[0]
    maps = {p.name: p.tma.box for p in kernel.params if p.kind == "tensormap" and p.tensor == "A"}
    assert maps == {"tm_A": (64, 128), "tm_A_1": (64, 64)}
    assert "tma_load_2d(a_stage, &tm_A, full," in kernel.source
    assert "tma_load_2d(b_stage, &tm_A_1, full," in kernel.source
    square = emit_plan(model, default_plan(model, T, {}, {"tile": "128x128x64"}), T).kernels[0]
    assert [p.name for p in square.params if p.kind == "tensormap" and p.tensor == "A"] == ["tm_A"]  # one box: one map


def test_a_square_matrix_times_itself_loads_b_through_its_own_map():
    model = load_program(DATA).models["SQUARE"]
    plan = default_plan(model, T, {}, {"tile": "128x128x64"})
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok
    kernel = emit_plan(model, plan, T).kernels[0]
    maps = {p.name: p.tma.box for p in kernel.params if p.kind == "tensormap" and p.tensor == "S"}
    assert maps == {"tm_S": (64, 128), "tm_S_1": (64, 64)}  # A: 64 k × 128 rows; B: 64 columns × 64 k, twice
    assert "tma_load_2d(a_stage, &tm_S, full," in kernel.source
    b_maps = re.findall(r"tma_load_2d\(b_stage[^,]*, &(\w+),", kernel.source)
    assert b_maps == ["tm_S_1", "tm_S_1"], b_maps  # two 64-column boxes a k tile, each through B's map


def test_regression_shared_412_both_operands_staged_from_one_tensor_get_a_buffer_each():
    """The fuzz's shared product 412 (S·S, both operands `staged`): both pre-passes wrote `@S`, so B's transposed
    copy overwrote A's and the plan kept every rule and computed something else (the field check: WRONG). B's copy
    is `@S_b` now: two passes, two buffers, the plan proven and printed with both."""
    model = load_program(DATA).models["SQUARE"]
    plan = default_plan(model, T, {}, {"A": "staged", "B": "staged"})
    k = plan.kernels[0]
    assert (str(k.a_move), str(k.b_move)) == ("staged", "staged"), k
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, ([v.describe() for v in proof.violations], proof.certificate and proof.certificate.failure)
    emitted = emit_plan(model, plan, T)
    text = "\n".join(x.source for x in emitted.kernels)
    assert "staged_S_b" in text and re.search(r"staged_S\b", text), text[:2000]
