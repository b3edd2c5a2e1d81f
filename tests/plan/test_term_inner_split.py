"""`terms:T` (habu/plan/term_split.py) and `inner:T` (habu/plan/inner_split.py): the derived MoE backward's
input gradient, a sum of two grouped GEMMs scattered into the tokens' rows, and its router-weight gradient,
a reduction over a grouped GEMM nested inside it, each taken apart into grouped GEMMs (f32 intermediates) and
the elementwise or row work around them. Proven like any plan; default plans take both."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.lower import lower_plan
from habu.plan import rewrite
from habu.plan.inner_split import inner_part
from habu.plan.rewrite import applicable, apply_rewrites
from habu.plan.term_split import terms_part
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.grad_program import derive_model
from habu.spec.ir import Load
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]
SHAPE = {"T": 13, "R": 26}


@pytest.fixture(scope="module")
def backward():
    bw = derive_model(load_program(ROOT / "tests" / "data" / "moe_small.habu"), "MOE-FFN")
    return bw.model.with_sizes(SHAPE)


def test_the_moe_backward_takes_both_rewrites_by_default(backward):
    assert {"terms:dX", "inner:dP"} <= set(applicable(backward))
    plan = default_plan(backward, TARGET, SHAPE, {})
    assert {"terms:dX", "inner:dP"} <= set(plan.rewrites)
    kinds = {" ".join(k.nodes): (k.kind, getattr(k, "main_loop", None)) for k in plan.kernels}
    for node in ("%dact", "dX.t0", "dX.t1", "dP.in"):
        assert kinds[node] == ("grouped", "wgmma"), kinds
    # dX's scatter-add of the two terms is general; dP's row reduction reads dY's rows through IX: a row kernel
    assert kinds["dX"][0] == "general" and kinds["dP"][0] == "rows"
    assert dict(plan.storage)["dX.t0"] == dict(plan.storage)["dP.in"] == "f32"
    assert verify_plan(backward, plan, SHAPE, trials=1, lowerings=lower_plan(backward, plan)).passed


def test_terms_makes_a_node_of_each_grouped_product_and_keeps_the_scatter(backward):
    graph = apply_rewrites(backward, ("terms:dX",))
    t0, t1, dx = (next(e for e in graph.nodes if e.target == t) for t in ("dX.t0", "dX.t1", "dX"))
    assert t0.scatter is None and t1.scatter is None
    assert dx.scatter == next(e for e in backward.nodes if e.target == "dX").scatter
    assert {x.tensor for x in (dx.rhs.args if hasattr(dx.rhs, "args") else ()) if isinstance(x, Load)} == {"dX.t0", "dX.t1"}


def test_inner_makes_the_nested_product_a_node_over_the_rows_and_the_outer_index(backward):
    graph = apply_rewrites(backward, ("inner:dP",))
    inner = next(e for e in graph.nodes if e.target == "dP.in")
    assert [v.extent for v in inner.lhs] == ["R", "D"]
    assert "dP.in" in {x.tensor for x in _loads(next(e for e in graph.nodes if e.target == "dP").rhs)}


def _loads(e):
    from habu.spec.ir import walk

    return [x for x in walk(e) if isinstance(x, Load)]


def test_neither_applies_where_no_grouped_gemm_is_found():
    m = parse_text("""8 EXTENT: #R  4 EXTENT: #D  6 EXTENT: #H
f32 TENSOR: A ( #R #H )  f32 TENSOR: B ( #R #H )  f32 TENSOR: W ( #D #H )  f32 TENSOR: Y ( #R #D )
f32 TENSOR: Q ( #R )
MODEL: TWO  Y[r d] = (Σ h A[r h] · W[d h]) + (Σ h B[r h] · W[d h]) ;
MODEL: NEST  Q[r] = Σ d (Σ h A[r h] · W[d h]) ;
""").models
    assert terms_part(m["TWO"], "Y") is None and inner_part(m["NEST"], "Q") is None


@pytest.mark.parametrize("kind", ["terms", "inner"])
def test_regression_a_rewrite_that_drops_a_term_is_killed(backward, kind, monkeypatch):
    """The rewritten plan is checked against the model as written: a rewrite that loses the second product
    (or reads the nested product wrong) fails the finite-field check."""
    ok, apply = rewrite.KINDS[kind]

    def wrong(model, target):
        graph = apply(model, target)
        eq = next(e for e in graph.nodes if e.target == target)
        if kind == "terms":  # dX keeps only the first product
            eq2 = replace(eq, rhs=eq.rhs.args[0])
        else:  # dP reads dP.in doubled
            eq2 = replace(eq, rhs=_doubled(eq.rhs))
        return replace(graph, nodes=tuple(eq2 if e is eq else e for e in graph.nodes))

    monkeypatch.setitem(rewrite.KINDS, kind, (ok, wrong))
    rewrite._apply_rewrites.cache_clear()
    try:
        plan = default_plan(backward, TARGET, SHAPE, {})
        assert f"{kind}:{'dX' if kind == 'terms' else 'dP'}" in plan.rewrites
        cert = verify_plan(backward, plan, SHAPE, trials=1, lowerings=lower_plan(backward, plan))
        assert not cert.passed
    finally:
        rewrite._apply_rewrites.cache_clear()


def _doubled(e):
    """The expression with its loads of dP.in doubled (a wrong value of the nested product)."""
    from fractions import Fraction

    from habu.spec.ir import Const, Op, Reduce

    if isinstance(e, Load) and e.tensor == "dP.in":
        return Op("mul", (e, Const(Fraction(2))))
    if isinstance(e, Op):
        return Op(e.fn, tuple(_doubled(a) for a in e.args))
    if isinstance(e, Reduce):
        return Reduce(e.op, e.vars, _doubled(e.body))
    return e


def test_the_grouped_products_before_a_sampled_scatter_run_only_the_column_tiles_it_reads():
    """dX's scatter-add (general) compares a few sampled columns: its two grouped products run every row tile of
    the column tiles holding them, not all (Mixtral's backward at T=16: 3 of 24 each, the proof 118 s -> 105 s)."""
    bw = derive_model(load_program(ROOT / "tests" / "data" / "moe_small.habu"), "MOE-FFN")
    model = bw.model.with_sizes({**SHAPE, "D": 1000})
    plan = default_plan(model, TARGET, {**SHAPE, "D": 1000}, {})
    cert = verify_plan(model, plan, {**SHAPE, "D": 1000}, trials=1)
    assert cert.passed, cert.failure
    texts = {k: v for k, v in cert.blocks.items() if "dX.t" in k}
    assert len(texts) == 2 and all("column tiles" in v and "(the columns a later kernel reads)" in v
                                   for v in texts.values()), cert.blocks
