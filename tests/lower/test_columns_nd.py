"""Column reductions over several leading axes (`G[n] = Σ b Σ s dY[b s n]`, the bias gradient of a 3-D
activation): the reduced axes flattened into the column kernel's rows (habu/lower/flatten.py), every
access reading its leading coordinates through the lowering's row → coordinates map."""

from __future__ import annotations

import pytest

from habu.lower import ColumnLowering, lower_plan
from habu.paths.emit import emit_plan
from habu.plan.patterns import as_column_reduction, default_regions
from habu.prove import prove
from habu.prove.verify import verify_plan
from habu.search.space import default_plan, enumerate_plans
from habu.spec.parser import parse_text
from habu.target import TARGETS

TARGET = TARGETS["sm_90a"]
GRAD3 = ("{B} EXTENT: #B  {S} EXTENT: #S  {N} EXTENT: #N\n"
         "bf16 TENSOR: dY ( #B #S #N )  f32 TENSOR: G ( #N )\n"
         "MODEL: G3  G[n] = Σ b Σ s dY[b s n] ;\n")


def grad3(b: int = 3, s: int = 37, n: int = 300):
    return parse_text(GRAD3.format(B=b, S=s, N=n), "g3.habu").models["G3"]


def test_regression_the_bias_gradient_of_a_3d_activation_was_a_general_kernel():
    """`Σ b Σ s dY[b s n]` (a reduction over two leading axes) fell to the general family (a thread per
    column, both axes loops); it is one column kernel over #B·#S rows now."""
    model = grad3()
    col = as_column_reduction(model.nodes[0])
    assert col is not None and [v.name for v in col.rs] == ["b", "s"]
    assert [r.kind for r in default_regions(model)] == ["columns"]
    plan = default_plan(model, TARGET, {}, {})
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ColumnLowering) and lw.leading == ("B", "S") and lw.kind_of(lw.loads[0][1]) == "row-column"
    assert verify_plan(model, plan, trials=2).passed
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "(int)((r / 37)) * (int)(11100) + (int)((r % 37)) * (int)(300)" in kernel.source


def test_the_reduced_axes_take_the_rows_order_of_the_load():
    """`Σ s b dY[b s n]` reduces the same rows: the leading order is the load's, not the reduction's."""
    text = GRAD3.format(B=2, S=5, N=64).replace("Σ b Σ s", "Σ s b")
    model = parse_text(text, "g3.habu").models["G3"]
    col = as_column_reduction(model.nodes[0])
    assert col is not None and [v.name for v in col.rs] == ["b", "s"]
    assert verify_plan(model, default_plan(model, TARGET, {}, {}), trials=1).passed


@pytest.mark.parametrize("shape", [(3, 37, 300), (1, 1, 1), (1, 5, 8), (4, 1, 129)], ids=lambda s: "x".join(map(str, s)))
def test_sampled_plans_of_a_two_axis_column_reduction_pass_the_check(shape):
    """Tails (300 columns, 111 rows in splits of 32 row loops), 1-element extents."""
    model = grad3(*shape)
    plans = list(enumerate_plans(model, TARGET, {}))[:: 7][:10]
    assert plans
    for plan in plans:
        assert prove(model, plan, {}, trials=1).ok, plan.kernels


def test_a_load_reading_the_leading_axes_out_of_order_is_no_column_reduction():
    text = ("3 EXTENT: #B  5 EXTENT: #S  8 EXTENT: #N\nf32 TENSOR: X ( #B #S #N )  f32 TENSOR: W ( #S #B )\n"
            "f32 TENSOR: G ( #N )\nMODEL: G3  G[n] = Σ b Σ s X[b s n] · W[s b] ;\n")
    model = parse_text(text, "g3.habu").models["G3"]
    assert as_column_reduction(model.nodes[0]) is None
    assert [r.kind for r in default_regions(model)] == ["general"]
