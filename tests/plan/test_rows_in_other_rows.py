"""A row kernel computes its nodes a row at a time, so a node may read what an earlier node of the kernel computed
only in its own row. Regression: the fuzz's model 16771 (`Y = max q2 ((Σ q3 −X0[q2 q3]) · X1[q2])`) derives a
backward whose hoisted statistic `S[q] = (Σ q2 −X0[q q2]) · X1[q]` is read along the columns by the next nodes
(`max q2 S[q2]`, `Σ q3 T[q3]`); the partition fused them into one row kernel and the field check crashed
(KeyError ('X0', ('c', 'c'))) instead of refusing it."""

from __future__ import annotations

from dataclasses import replace

from habu.cli_grad import backward_program
from habu.plan.plan import RowKernel
from habu.plan.row_fusion import reads_own_rows
from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS
from tests.random_models import random_model

T = TARGETS["sm_90a"]


def _backward():
    program, name = backward_program(parse_text(random_model(16771), "fuzz.habu"), "FZ", None, "auto")
    return program.models[name]


def test_regression_fuzz_16771_a_statistic_read_in_other_rows_starts_a_kernel_of_its_own():
    model = _backward()
    plan = default_plan(model, T, {})
    for k in plan.kernels:
        if isinstance(k, RowKernel):
            nodes = [eq for eq in model.nodes if eq.target in k.nodes]
            assert all(reads_own_rows(eq, before.target) for i, eq in enumerate(nodes) for before in nodes[:i])
    assert prove(model, plan, {}, trials=1).ok


def test_regression_fuzz_16771_such_a_kernel_is_refused_by_a_rule_not_a_crash():
    model = _backward()
    plan = default_plan(model, T, {})
    last = plan.kernels[-1]
    assert isinstance(last, RowKernel) and last.nodes == ("dX1",)
    i = next(j for j, k in enumerate(plan.kernels) if "%h3" in k.nodes)
    fused = replace(last, nodes=tuple(n for k in plan.kernels[i:] for n in k.nodes))
    proof = prove(model, replace(plan, kernels=(*plan.kernels[:i], fused)), {}, trials=1)
    assert not proof.ok
    assert any(v.rule.name == "supported-path" and "in other rows" in v.detail for v in proof.violations)


def test_a_row_reading_the_statistic_of_its_own_row_still_fuses():
    """RMSNorm's `Y[r d] = X[r d] · R1[r]` after `R1[r] = rsqrt(Σ d X[r d]² / #D + ε)`: one row kernel."""
    from habu.spec.parser import load_program
    from tests.conftest import ROOT

    model = load_program(ROOT / "examples" / "rmsnorm.habu").models["RMSNORM-ROWS"]
    plan = default_plan(model, T, {})
    assert len(plan.kernels) == 1 and isinstance(plan.kernels[0], RowKernel)
