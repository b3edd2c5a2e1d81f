"""A row kernel computes its nodes a row at a time, so a node may read what an earlier node of the kernel computed
only in its own row. Regression: the fuzz's model 16771 (`Y = max q2 ((Σ q3 −X0[q2 q3]) · X1[q2])`) derived (in
session 60, between hoisting loop invariants and sharing them across the gradients) a backward whose statistic
`S[q] = (Σ q2 −X0[q q2]) · X1[q]` is read along the columns by the next nodes (`max q2 S[q2]`, `Σ q3 W[q3]`); the
partition fused them into one row kernel and the field check crashed (KeyError ('X0', ('c', 'c'))) instead of
refusing it. The nodes below are that backward's dX1 and the two statistics it read."""

from __future__ import annotations

from dataclasses import replace

from habu.plan.plan import RowKernel
from habu.plan.row_fusion import reads_own_rows
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS

T = TARGETS["sm_90a"]

NODES = """
64 EXTENT: #Q
bf16 TENSOR: X0 ( #Q #Q )
f32 TENSOR: X1 ( #Q )
f32 TENSOR: dY ( )
f32 TENSOR: S ( #Q )
f32 TENSOR: W ( #Q )
f32 TENSOR: dX1 ( #Q )
MODEL: S  S[q] = (Σ q2 −X0[q q2]) · X1[q] ;
MODEL: W  W[q] = 1 − step((max q2 S[q2]) − S[q]) ;
MODEL: DX1  dX1[q] = dY · ((1 − step((max q2 S[q2]) − S[q])) / (Σ q3 W[q3])) · (Σ q4 −X0[q q4]) ;
"""


def _backward():
    """One model of the three nodes: S and W intermediates, dX1 its output."""
    models = parse_text(NODES, "rows16771.habu").models
    s, w, dx1 = models["S"], models["W"], models["DX1"]
    inputs = tuple({t.name: t for m in (s, w, dx1) for t in m.inputs if t.name not in ("S", "W")}.values())
    return replace(dx1, name="FZ-GRAD", inputs=inputs, intermediates=(*s.outputs, *w.outputs),
                   nodes=(*s.nodes, *w.nodes, *dx1.nodes))


def test_regression_fuzz_16771_a_statistic_read_in_other_rows_starts_a_kernel_of_its_own():
    model = _backward()
    plan = default_plan(model, T, {})
    for k in plan.kernels:
        if isinstance(k, RowKernel):
            nodes = [eq for eq in model.nodes if eq.target in k.nodes]
            assert all(reads_own_rows(eq, before.target) for i, eq in enumerate(nodes) for before in nodes[:i])
    assert len(plan.kernels) == 3
    assert prove(model, plan, {}, trials=1).ok


def test_regression_fuzz_16771_such_a_kernel_is_refused_by_a_rule_not_a_crash():
    model = _backward()
    plan = default_plan(model, T, {})
    last = plan.kernels[-1]
    assert isinstance(last, RowKernel) and last.nodes == ("dX1",)
    fused = replace(last, nodes=("S", "W", "dX1"))
    proof = prove(model, replace(plan, kernels=(fused,)), {}, trials=1)
    assert not proof.ok
    assert any(v.rule.name == "supported-path" and "in other rows" in v.detail for v in proof.violations)


def test_a_row_reading_the_statistic_of_its_own_row_still_fuses():
    """RMSNorm's `Y[r d] = X[r d] · R1[r]` after `R1[r] = rsqrt(Σ d X[r d]² / #D + ε)`: one row kernel."""
    from habu.spec.parser import load_program
    from tests.conftest import ROOT

    model = load_program(ROOT / "examples" / "rmsnorm.habu").models["RMSNORM-ROWS"]
    plan = default_plan(model, T, {})
    assert len(plan.kernels) == 1 and isinstance(plan.kernels[0], RowKernel)


def test_regression_fuzz_520_an_elementwise_node_after_a_row_statistic_is_no_row_of_it():
    """The fuzz's model 520 (`Y[p2] = abs(Σ p3 erf(exp(X0[p2])))`): session 62's backward makes the sum a node of
    its own (`%h2[p] = Σ p3 …`), and the elementwise node after it (`%h1[p] = dY[p] · step(%h2[p]) …`, same
    shape, its only reader) was fused into its row kernel, whose lowering then raised "not row-local" from the
    plan enumeration. The two stay apart; every plan enumerates and the default is proven."""
    from habu.cli_grad import backward_program
    from habu.plan.patterns import default_regions, row_local
    from habu.search.space import enumerate_plans
    from tests.random_models import random_model

    program, name = backward_program(parse_text(random_model(520), "fuzz.habu"), "FZ", None, "auto")
    model = program.models[name]
    nodes = {eq.target: eq for eq in model.nodes}
    assert all(row_local(nodes[r.output]) is not None for r in default_regions(model) if r.kind == "rows")
    assert list(enumerate_plans(model, T, {}))
    assert prove(model, default_plan(model, T, None, {}), trials=1).ok
