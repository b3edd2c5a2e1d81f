"""`epilogue_prefetch`: at each tile's start the wgmma producer prefetches into the L2 the tile's lines of each
matrix the epilogue loads (habu/lower/epilogue_prefetch.py), at the access's offsets under its masks. A hint: the
plan's proof is the same with or without it."""

from __future__ import annotations

from habu.emit_cuda.nvrtc import _nvrtc, compile_cuda
from habu.lower import lower_plan
from habu.paths.emit import emit_plan
from habu.prove import prove
from habu.prove.verify import field_key
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]


def test_the_gelu_derivatives_saved_s1_is_prefetched_line_by_line_under_its_masks():
    model = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP").model.with_sizes({"B": 100})
    plan = default_plan(model, T, {}, {"epilogue_prefetch": "true", "epilogue_early": "false"})
    base = default_plan(model, T, {}, {"epilogue_early": "false"})
    i = next(j for j, k in enumerate(plan.kernels) if "%d2" in k.nodes)
    lw = lower_plan(model, plan)[i]
    (pf,) = lw.prefetches  # S1 (its tile of 128 × 128 bf16: two 128-byte lines a row); B1 is one row, not prefetched
    assert pf.access.tensor == "S1" and (pf.rows, pf.lines_per_row, pf.line_elems) == (128, 2, 64)
    kernel = emit_plan(model, plan, T).kernels[i]
    assert "for (int i = ptid; i < 256; i += 128) {  // S1's tile into the L2" in kernel.source
    assert "if ((m) < 100 && (n) < 14336) habu::prefetch_l2(p_S1 + ((int)(m) * (int)(14336) + (int)(n)));" in kernel.source
    assert "prefetch_l2" not in emit_plan(model, base, T).kernels[i].source
    # no value depends on it: the field check of both plans is one
    assert field_key(model, plan, {"B": 100}) == field_key(model, base, {"B": 100})
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.detail for o in proof.violations] or proof.certificate.failure  # type: ignore[union-attr]
    if _nvrtc() is not None:
        res = compile_cuda(kernel.source, kernel.name, "sm_90a").resources
        assert not res.spills, res.describe()


def test_the_search_offers_the_prefetch_where_an_epilogue_loads_a_matrix():
    from habu.paths import region_space
    from habu.plan.rewrite import apply_rewrites
    from habu.search.cuts import default_partition

    model = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP").model.with_sizes({"B": 128})
    plan = default_plan(model, T, {})
    graph, sizes = apply_rewrites(model, plan.rewrites), dict(plan.shape)
    offered = {r.nodes[0]: [k for k in region_space(graph, r, T, sizes) if getattr(k, "epilogue_prefetch", False)]
               for r in default_partition(graph, T, sizes) if r.kind == "contraction"}
    # dT6 for dX; GELU's derivative reads S1 into registers at the tile's start (the default's early loads)
    assert offered["%d3"] == [] and len(offered["%rdX"]) == 1
    assert offered["dW1"] == offered["dW2"] == []  # no epilogue loads


def test_prefetch_skips_what_the_early_loads_read():
    """Regression (session 58): under the early-loads default, `epilogue_prefetch` also warmed the S1 lines the
    consumers had read into registers at the tile's start: L2 traffic for nothing."""
    model = derive_model(load_program(ROOT / "examples" / "ffn_skip.habu"), "FFN-SKIP").model.with_sizes({"B": 100})
    plan = default_plan(model, T, {}, {"epilogue_prefetch": "true"})
    i = next(j for j, k in enumerate(plan.kernels) if "%d2" in k.nodes)
    lw = lower_plan(model, plan)[i]
    assert {e.access.tensor for e in lw.early_loads} >= {"S1"}
    assert lw.prefetches == ()
    assert "prefetch_l2" not in emit_plan(model, plan, T).kernels[i].source
