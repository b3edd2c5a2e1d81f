"""The MoE benchmark's pieces on the CPU: its routing (sorted by expert, Zipf leaving experts empty)
and its torch loop, which the GPU rows are checked against, computing the language's meaning."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the benchmark's baselines are torch")

from habu.bench.moe_speed import grouped_mm, rel_error, routing, torch_loop  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
from habu.spec.reference import evaluate  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


@pytest.mark.parametrize("kind", ["uniform", "zipf"])
def test_routing_is_sorted_by_expert_with_offsets_at_each_groups_end(kind):
    ix, e, _, offsets = routing(64, 2, 8, kind, seed=1, device="cpu")
    assert len(ix) == 128 and bool((e[1:] >= e[:-1]).all())
    counts = torch.bincount(e.long(), minlength=8)
    assert offsets.tolist() == torch.cumsum(counts, 0).tolist()
    assert all(sorted(ix[e == g].tolist()) == sorted(set(ix[e == g].tolist())) for g in range(8))  # distinct top-k
    if kind == "zipf":
        assert int((counts == 0).sum()) >= 2  # a quarter of the experts are never chosen


def test_the_float64_torch_loop_is_the_models_meaning_and_grouped_mm_agrees():
    model = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    ix, e, p, offsets = routing(37, 2, 8, "zipf", seed=2, device="cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn((37, 40), generator=g).bfloat16()
    w = {k: (torch.randn(s, generator=g) * 0.2).bfloat16() for k, s in
         (("W1", (8, 24, 40)), ("W3", (8, 24, 40)), ("W2", (8, 40, 24)))}
    y = torch.randn((37, 40), generator=g)
    ref = torch_loop(x, w, ix, p, offsets, y.double(), dtype=torch.float64)
    inputs = {"X": x.double().numpy(), **{k: v.double().numpy() for k, v in w.items()}, "P": p.double().numpy(),
              "Y": y.double().numpy(), "IX": ix.numpy(), "E": e.numpy()}
    np.testing.assert_allclose(ref.numpy(), evaluate(model, inputs)["Y"], rtol=1e-12, atol=1e-12)
    assert rel_error(torch_loop(x, w, ix, p, offsets, y), ref) < 2e-2
    assert rel_error(grouped_mm(x, w, ix, p, offsets, y), ref) < 2e-2


def test_the_combine_bench_plans_are_grouped_wgmma_tiles_the_rules_accept():
    """habu.bench.moe_combine_speed's plans at Mixtral's combine (the rules only: the field check runs on the GPU
    machine's build)."""
    from habu.bench.moe_combine_speed import MODEL, PLANS
    from habu.bench.moe_speed import SHAPES
    from habu.prove.rules import failures, obligations
    from habu.search.space import default_plan
    from habu.spec.parser import parse_text
    from habu.target import TARGETS

    s = SHAPES["mixtral"]
    sizes = {"T": 4096, "R": 8192}
    m = parse_text(MODEL.format(experts=s.experts, d=s.d, h=s.h)).models["COMBINE"].with_sizes(sizes)
    tiles = set()
    for _, pins in PLANS:
        plan = default_plan(m, TARGETS["sm_90a"], sizes, pins)
        (k,) = plan.kernels
        assert k.kind == "grouped" and k.main_loop == "wgmma"
        assert not failures(obligations(m, plan, sizes)), pins
        tiles.add((k.bm, k.bn, k.stages))
    assert len(tiles) == len(PLANS)
