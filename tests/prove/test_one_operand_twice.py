"""A product that reads one tensor as both operands, over one extent (the Gram matrix O = A·Aᵀ: m and n both over
#M). Found in session 58: with unequal tiles along m and n its default plan failed the field check ("O[0, 128] was
never written": the check's sample box took the m tiles' rows for both of O's dims, as both are over #M), and the
emitter gave both operands one tensor map, the first one's box (B's loads 128 rows into a 64-row stage)."""

from __future__ import annotations

import pytest

from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS

T = TARGETS["sm_90a"]
GRAM = """
1024 EXTENT: #M
1024 EXTENT: #K
bf16 TENSOR: A ( #M #K )
f32 TENSOR: O ( #M #M )
MODEL: GRAM  O[m m2] = Σ k A[m k] · A[m2 k] ;
"""


def _gram():
    return parse_text(GRAM, "gram.habu").models["GRAM"]


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
