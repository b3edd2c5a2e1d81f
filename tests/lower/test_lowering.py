"""The lowering: raster orders are bijections, k ranges partition k, accesses follow the model."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from habu.lower import lower_plan
from habu.lower.access import Bound, Position
from habu.prove.interp import PlanFault, check_raster
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

SIZES = {"M": 1000, "N": 700, "K": 511}


def ggemm_lowering(**changes):
    m = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"].with_sizes(SIZES)
    plan = default_plan(m, TARGETS["sm_90a"], SIZES)
    changes = {"a_move": "ldg", "b_move": "ldg", **changes}  # the direct paths (K = 511 is staged by default)
    plan = replace(plan, kernels=(replace(plan.kernels[0], **changes),))
    return lower_plan(m, plan)[0]


@pytest.mark.parametrize("raster, group, split", [("row", 1, 1), ("column", 1, 1), ("row", 8, 1), ("column", 8, 3),
                                                  ("row", 3, 2)])
def test_raster_orders_cover_every_tile_once(raster, group, split):
    lw = ggemm_lowering(raster=raster, group_m=group, split_k=split)
    check_raster("k", lw, SIZES)  # raises on a duplicate or a missing tile


def test_a_broken_raster_is_caught():
    lw = ggemm_lowering()

    class Broken(type(lw)):  # type: ignore[misc]
        def tile_of(self, linear, s):
            tm, tn, sp = super().tile_of(linear, s)
            return np.minimum(tm, 2), tn, sp

    bad = Broken(**{f: getattr(lw, f) for f in lw.__dataclass_fields__})
    with pytest.raises(PlanFault, match="twice"):
        check_raster("k", bad, SIZES)


@pytest.mark.parametrize("split", [1, 2, 3, 5])
def test_k_ranges_partition_the_k_tiles(split):
    lw = ggemm_lowering(split_k=split)
    covered = []
    for s in range(split):
        b, e = lw.k_range(s, SIZES)
        covered += list(range(b, max(b, e)))
    assert covered == list(range(lw.k_tiles(SIZES)))


def test_gathered_operand_access():
    lw = ggemm_lowering()
    assert lw.a.positions == (Position("gather", "m", table="IX"), Position("axis", "k"))
    assert set(lw.a.masks) == {Bound("m", "M"), Bound("k", "K")}
    assert lw.a.strides == (("K",), ())
    assert lw.b.positions == (Position("axis", "n"), Position("axis", "k"))
    assert lw.out.masks == (Bound("m", "M"), Bound("n", "N"))


def test_epilogue_of_a_fused_region():
    m = load_program(ROOT / "examples" / "ffn_skip.habu").models["FFN-SKIP"]
    lw = lower_plan(m, default_plan(m, TARGETS["sm_90a"]))[0]
    from habu.spec.equation import format_expr

    assert format_expr(lw.epilogue) == "0.5 · (%acc + B1[0 n]) · (1 + erf((%acc + B1[0 n]) · 0.7071067811865476))"
    assert [ld.tensor for ld, _ in lw.epi_loads] == ["B1"]


def test_staged_operands_read_aligned_buffers():
    lw = ggemm_lowering(a_move="staged", b_move="staged")
    assert [st.dst.tensor for st in lw.pre] == ["@A", "@B"]
    assert lw.a.tensor == "@A" and lw.a.strides == (("K^8",), ()) and lw.a.extents == ("M", "K^8")
    assert lw.pre[0].src.positions[0] == Position("gather", "m", table="IX")  # the gather moved to the pass
    assert lw.a.stride(0, SIZES) == 512


@pytest.mark.parametrize("raster, group", [("row", 1), ("column", 1), ("row", 8), ("column", 8), ("row", 3)])
def test_a_cluster_takes_vertically_adjacent_tiles_of_one_raster_step(raster, group):
    """Clusters of 2 along m: indices 2i and 2i+1 are tiles (2pm, tn) and (2pm + 1, tn), and the
    raster still computes every tile once (1000 rows: 8 tiles of 128, an even count)."""
    lw = ggemm_lowering(raster=raster, group_m=group, cluster_m=2, tile_m=128)
    check_raster("k", lw, SIZES)
    ids = np.arange(int(lw.tiles(SIZES)), dtype=np.int64)
    tm, tn, _ = lw.tile_of(ids, SIZES)
    assert np.array_equal(tm[0::2] % 2, np.zeros(len(ids) // 2)) and np.array_equal(tm[1::2], tm[0::2] + 1)
    assert np.array_equal(tn[0::2], tn[1::2])


def test_a_cluster_over_an_odd_count_of_tile_rows_misses_tiles_and_the_check_says_so():
    sizes = {**SIZES, "M": 300}  # 3 tiles of 128 rows: the cluster-tiles rule rejects it first
    lw = ggemm_lowering(cluster_m=2, tile_m=128)
    with pytest.raises(PlanFault):
        check_raster("k", lw, sizes)


def test_a_persistent_cluster_grid_is_a_whole_number_of_clusters():
    lw = ggemm_lowering(cluster_m=2, tile_m=128, tile_n=128, persistent=True)
    big = {**SIZES, "M": 4096, "N": 4096}
    assert lw.grid(big, 131) == 130 and lw.grid(big, 132) == 132
    assert lw.grid({**SIZES, "N": 64}, 132) == 8  # 8 tiles in all
