"""A scalar output (`d = Σ n x[n] · y[n]`, AXPY-RELU's `da`) is a column reduction of one column: the
patterns send it to the column family (the general family reduced every element in one thread), its
rows split over the grid and the splits add atomically into the zeroed f32 output; the finite-field
check executes it, and a plan whose splits store where they must add is refused by the rules and
caught by the check."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import ColumnLowering, lower_plan
from habu.plan.patterns import as_column_reduction, default_regions
from habu.prove.rules import failures, obligations
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS

DOT = """5000 EXTENT: #N  3 EXTENT: #B
f32 TENSOR: x ( #N )  bf16 TENSOR: y ( #N )  f32 TENSOR: a ( )  f32 TENSOR: d ( )
bf16 TENSOR: Z ( #B #N )  f32 TENSOR: e ( )
MODEL: DOT  d = Σ n x[n] · y[n] ;
MODEL: SCALED  d = Σ n x[n] · a ;
MODEL: MAX  d = max n x[n] ;
MODEL: TWO-AXES  e = Σ b Σ n Z[b n] ;
"""


def _model(name: str):
    return parse_text(DOT, "dot.habu").models[name]


def test_a_scalar_reduction_is_a_column_reduction_of_one_column():
    for name in ("DOT", "SCALED", "MAX", "TWO-AXES"):
        model = _model(name)
        (eq,) = model.nodes
        col = as_column_reduction(eq)
        assert col is not None and col.n is None, name
        assert [r.kind for r in default_regions(model)] == ["columns"], name
        (lw,) = lower_plan(model, default_plan(model, TARGETS["sm_90a"]))
        assert isinstance(lw, ColumnLowering) and lw.c == "" and lw.tile == 1 and lw.extents == ()
        assert int(lw.splits({"N": 5000, "B": 3})) >= 1


def test_scalar_reductions_split_their_rows_and_pass_the_finite_field_check():
    for name, pins in (("DOT", {"rows_per_split": "700", "unroll": "2", "threads": "128"}), ("MAX", {}),
                       ("TWO-AXES", {"rows_per_split": "999"}), ("SCALED", {})):
        model = _model(name)
        plan = default_plan(model, TARGETS["sm_90a"], {}, pins)
        (lw,) = lower_plan(model, plan)
        assert lw.combine in ("atomic", "atomic-max") and int(lw.splits({"N": 5000, "B": 3})) > 1, name
        assert not failures(obligations(model, plan)), name
        cert = verify_plan(model, plan, trials=1)
        assert cert.passed, (name, cert.failure)


def test_regression_a_scalar_whose_splits_store_is_refused_and_caught():
    """Splits that store the one output value (the last write wins) instead of adding: the finite-field
    check fails it (the rules pass the correct plan)."""
    model = _model("DOT")
    plan = default_plan(model, TARGETS["sm_90a"], {}, {"rows_per_split": "1000"})
    assert not failures(obligations(model, plan))
    lowerings = lower_plan(model, plan)
    assert lowerings[0].combine == "atomic" and int(lowerings[0].splits({"N": 5000})) == 5
    lowerings[0] = replace(lowerings[0], combine="store")
    cert = verify_plan(model, plan, trials=1, lowerings=lowerings)
    assert not cert.passed
