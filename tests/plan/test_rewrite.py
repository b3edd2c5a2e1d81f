"""Algebraic rewrites: RMSNorm + Linear's row scale moved after the contraction, a copy inlined
into the contraction that reads it; each kept only when the finite-field check passes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.plan.partitions import partitions
from habu.plan.patterns import default_regions
from habu.plan.plan import Plan
from habu.plan.rewrite import RewriteError, applicable, apply_rewrites, rewrite_sets
from habu.prove.rules import failures, obligations
from habu.prove.verify import verify_plan
from habu.search.space import concrete_sizes, default_kernels, make_plan
from habu.spec.ir import Equation, Gather, IndexVar, Load, Op, Reduce, TensorDecl
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

SM90 = TARGETS["sm_90a"]


def rmsnorm_linear(sizes=None):
    m = next(iter(load_program(ROOT / "examples" / "rmsnorm_linear.habu").models.values()))
    return m.with_sizes(sizes) if sizes else m


def test_rmsnorm_linear_offers_the_row_scale_factoring():
    m = rmsnorm_linear()
    assert applicable(m) == ["factor:Y"]
    assert rewrite_sets(m) == [(), ("factor:Y",)]
    g = apply_rewrites(m, ("factor:Y",))
    assert [eq.target for eq in g.nodes] == ["Y.scale", "Y.sum", "Y"]
    scale = g.nodes[0]
    assert len(scale.lhs) == 1 and scale.lhs[0].extent == "T"  # one number per row
    assert {ld.tensor for ld in _loads(g.nodes[1].rhs)} == {"X", "W"}  # the contraction reads X itself
    assert [(r.kind, r.nodes) for r in default_regions(g)] == [("rows", ("Y.scale",)),
                                                              ("contraction", ("Y.sum", "Y"))]
    assert g.canonical_hash() != m.canonical_hash()


def _loads(e):
    from habu.spec.ir import walk

    return [x for x in walk(e) if isinstance(x, Load)]


@pytest.mark.parametrize("sizes", [None, {"T": 37, "D": 100, "N": 72}], ids=["example", "ragged"])
def test_every_partition_of_the_rewritten_model_proves(sizes):
    m = rmsnorm_linear(sizes)
    s = concrete_sizes(m)
    g = apply_rewrites(m, ("factor:Y",))
    for parts in partitions(g):
        plan = make_plan(m, SM90, default_kernels(g, SM90, s, parts), s, ("factor:Y",))
        assert plan.model_hash == m.canonical_hash()  # a plan of the model as written
        assert dict(plan.storage)["Y.scale"] == "f32"
        assert not failures(obligations(m, plan, s))
        cert = verify_plan(m, plan, s, trials=2)
        assert cert.passed, cert.failure


def test_a_wrong_rewrite_fails_the_finite_field_check(monkeypatch, request):
    """The scale applied along the output's columns instead of its rows: the finite-field check
    of the rewritten plan against the model as written must catch it."""
    import habu.plan.rewrite as rw

    m = rmsnorm_linear({"T": 64, "D": 64, "N": 64})
    s = concrete_sizes(m)
    right = rw._apply_factor

    def wrong(model, target):
        g = right(model, target)
        nodes = []
        for eq in g.nodes:
            if eq.target == target:  # Y[t n] = Y.sum[t n] · Y.scale[n]
                n = eq.lhs[1]
                eq = Equation(eq.target, eq.lhs, Op("mul", (Load("Y.sum", eq.lhs), Load("Y.scale", (n,)))))
            nodes.append(eq)
        return replace(g, nodes=tuple(nodes))

    monkeypatch.setitem(rw.KINDS, "factor", (rw.KINDS["factor"][0], wrong))
    rw._apply_rewrites.cache_clear()  # rewritten models are remembered: none made with the wrong
    request.addfinalizer(rw._apply_rewrites.cache_clear)  # rewrite may outlive this test
    g = apply_rewrites(m, ("factor:Y",))
    plan = make_plan(m, SM90, default_kernels(g, SM90, s), s, ("factor:Y",))
    cert = verify_plan(m, plan, s, trials=1)
    assert not cert.passed and "Y" in cert.failure


def test_a_plan_keeps_its_rewrites_through_json_and_old_plans_keep_their_keys():
    m = rmsnorm_linear()
    s = concrete_sizes(m)
    g = apply_rewrites(m, ("factor:Y",))
    plan = make_plan(m, SM90, default_kernels(g, SM90, s), s, ("factor:Y",))
    again = Plan.from_json(plan.to_json())
    assert again == plan and again.rewrites == ("factor:Y",)
    plain = make_plan(m, SM90, default_kernels(m, SM90, s), s)
    assert "rewrites" not in plain.to_json()


def test_a_rewrite_that_does_not_apply_is_a_clear_error():
    m = rmsnorm_linear()
    with pytest.raises(RewriteError, match="does not apply"):
        apply_rewrites(m, ("inline:Y",))
    with pytest.raises(RewriteError, match="unknown rewrite"):
        apply_rewrites(m, ("fold:Y",))


def test_inline_moves_a_gathered_copy_into_the_operand_load():
    """G[r k] = X[IX[r] k]; H[r n] = Σ k G[r k]·W[n k]  becomes  H[r n] = Σ k X[IX[r] k]·W[n k]."""
    m0 = next(iter(load_program(ROOT / "examples" / "moe_gather.habu").models.values()))
    m0 = m0.with_sizes({"T": 96, "R": 64, "N": 48, "K": 40})
    r, k, n = IndexVar("r", "R"), IndexVar("k", "K"), IndexVar("n", "N")
    copy = Equation("G", (r, k), Load("X", (Gather("IX", (r,)), k)))
    mm = Equation("H", (r, n), Reduce("sum", (k,), Op("mul", (Load("G", (r, k)), Load("W1", (n, k))))))
    m = replace(m0, nodes=(copy, mm), intermediates=(TensorDecl("G", ("R", "K"), None),))
    assert applicable(m) == ["inline:G"]
    g = apply_rewrites(m, ("inline:G",))
    assert [eq.target for eq in g.nodes] == ["H"] and not g.intermediates
    assert g.nodes[0] == m0.nodes[0]  # exactly the gathered GEMM as the example writes it
    s = concrete_sizes(m)
    plan = make_plan(m, SM90, default_kernels(g, SM90, s), s, ("inline:G",))
    cert = verify_plan(m, plan, s, trials=2)
    assert cert.passed, cert.failure


def test_the_search_on_cpu_picks_the_factored_graph_for_rmsnorm_linear(tmp_path):
    from habu.db import PlanDB
    from habu.search.loop import Budget, Search

    m = rmsnorm_linear()
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(ROOT / "examples" / "rmsnorm_linear.habu"), m, SM90, concrete_sizes(m), db,
                        Budget(trials=4)).run()
        stored = db.get(result.key).records[0]
    assert result.best.rewrites == ("factor:Y",)
    assert stored.plan["rewrites"] == ["factor:Y"] and stored.certificate["passed"]


def test_the_report_and_the_table_say_which_rewrites_a_plan_uses():
    from habu.compile import report
    from habu.prove import prove
    from habu.search.report import plan_summary

    m = rmsnorm_linear({"T": 64, "D": 64, "N": 64})
    s = concrete_sizes(m)
    g = apply_rewrites(m, ("factor:Y",))
    plan = make_plan(m, SM90, default_kernels(g, SM90, s), s, ("factor:Y",))
    assert plan_summary(plan.to_json()).startswith("factor:Y → rows ")
    # regression: "[factor:Y]" vanished from the best-plans table (rich read it as markup)
    from rich.console import Console

    from habu.db import Record
    from habu.search.report import top_table

    console = Console(width=300, record=True)
    console.print(top_table([Record(rank=0, plan=plan.to_json(), status="unmeasured")], None))
    assert "factor:Y → rows" in console.export_text()
    text = report(m, [plan], [prove(m, plan, s, trials=1)])
    assert "rewrites factor:Y" in text and "Y[t n] = Y.sum[t n] · Y.scale[t]" in text
