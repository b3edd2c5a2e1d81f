"""`with_kernel` (the search's cheap relowering of one region under another schedule) gives exactly
the lowering `lower_contraction` builds from scratch."""

from __future__ import annotations

import itertools

import pytest

from habu.lower.contraction import lower_contraction, with_kernel
from habu.search.patterns import default_regions
from habu.search.space import concrete_sizes, default_kernels, region_space
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT


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
