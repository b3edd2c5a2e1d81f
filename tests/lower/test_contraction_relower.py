"""`with_kernel` (the search's cheap relowering of one region under another schedule) gives exactly
the lowering `lower_contraction` builds from scratch."""

from __future__ import annotations

import itertools

import pytest

from habu.lower.contraction import lower_contraction, with_kernel
from habu.plan.patterns import default_regions
from habu.search.space import concrete_sizes, default_kernels, region_space
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT, winner_plan


@pytest.mark.parametrize("example, sizes", [("ggemm.habu", {"K": 511}), ("moe_gather.habu", None),
                                            ("rmsnorm_linear.habu", None)])
def test_with_kernel_equals_lowering_from_scratch(example, sizes):
    m = next(iter(load_program(ROOT / "examples" / example).models.values()))
    m = m.with_sizes(sizes) if sizes else m
    s = concrete_sizes(m)
    t = TARGETS["sm_90a"]
    regions = default_regions(m)
    i = next(j for j, r in enumerate(regions) if r.kind == "contraction")
    base = lower_contraction(m, default_kernels(m, t, s, regions)[i])
    kernels = list(itertools.islice(region_space(m, regions[i], t, s), 0, None, 97))
    assert any(k.a_move == "staged" for k in kernels) and any(k.split_k > 1 for k in kernels)
    for k in kernels:
        assert with_kernel(base, k) == lower_contraction(m, k), k


def test_a_transposing_staging_pass_moves_tiles_and_a_gathering_one_rows():
    """W stored (D, N) staged K-major is a transpose: it is copied in 32 x 32 tiles (its reads run
    along W's rows); a gathered A staged keeps one block per row. The finite-field check runs the
    same pass either way, block by block through the lowering's thread maps."""
    from habu.compile import bind_shape
    from habu.lower import lower_plan
    from habu.lower.staging import StageTile
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS
    from tests.conftest import ROOT

    t = TARGETS["sm_90a"]
    m = bind_shape(load_program(ROOT / "examples" / "rmsnorm_linear.habu").models["RMSNORM-LINEAR"],
                   {"T": 300, "D": 1000, "N": 520})
    s = {e.name: e.size for e in m.extents}
    plan = winner_plan(m, t, s)
    (stage,) = [st for lw in lower_plan(m, plan) for st in getattr(lw, "pre", ())]
    assert stage.tile == StageTile("n", 32, 32) and stage.grid(s) == (-(-1000 // 32), -(-520 // 32))
    from habu.prove.verify import verify_plan

    assert verify_plan(m, plan, s, trials=1, seeds=[5]).passed
    gg = bind_shape(load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"], {"M": 256, "N": 256, "K": 512})
    (a_stage,) = lower_plan(gg, default_plan(gg, t, None, {"A": "staged"}))[0].pre
    assert a_stage.tile is None and a_stage.grid({"M": 256, "N": 256, "K": 512}) == (2, 256)
