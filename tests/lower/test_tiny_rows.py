"""Tiny outputs over a trailing axis (issue 19): `O[b] = Σ i X[b i]` with a few long rows is a
transposed column reduction (`ColumnReduction.transposed`: the loads read `[c r]`), which the column
family computes with the rows split over the grid, where the row family gave one block per row (a
few SMs busy) and a reduction over several trailing axes (`Σ i j X[b i j]`) was a general kernel of
one thread per output. Every plan of the GPU test (tests/gpu/test_tiny_rows.py) is proven here."""

from __future__ import annotations

import pytest

from habu.errors import UsageError
from habu.lower import ColumnLowering, lower_plan
from habu.paths import region_space
from habu.plan.patterns import as_column_reduction, default_regions, transposed_rows
from habu.plan.plan import ColumnKernel, RowKernel
from habu.prove import prove
from habu.prove.rules import obligations
from habu.search.space import default_plan
from habu.spec.parser import parse_text
from habu.target import TARGETS
from tests.gpu.test_tiny_rows import CASES

TARGET = TARGETS["sm_90a"]


def model_of(text: str, name: str = "T"):
    return parse_text(text, "tiny.habu").models[name]


def sum_rows(rows: int, cols: int, out: str = "f32"):
    return model_of(f"{rows} EXTENT: #B  {cols} EXTENT: #I  f32 TENSOR: X ( #B #I )  {out} TENSOR: O ( #B )\n"
                    "MODEL: T  O[b] = Σ i X[b i] ;\n")


def test_a_reduction_over_the_trailing_axis_is_a_transposed_column_reduction():
    (eq,) = sum_rows(4, 100000).nodes
    col = as_column_reduction(eq)
    assert col is not None and col.transposed and col.n.name == "b" and [v.name for v in col.rs] == ["i"]
    plain = model_of("8 EXTENT: #R  4 EXTENT: #C  f32 TENSOR: X ( #R #C )  f32 TENSOR: G ( #C )\n"
                     "MODEL: T  G[c] = Σ r X[r c] ;\n")
    col = as_column_reduction(plain.nodes[0])
    assert col is not None and not col.transposed


@pytest.mark.parametrize("rows,cols,out,tiny", [(4, 100000, "f32", True), (8, 16384, "f32", True),
                                                (16, 262144, "f32", False), (4, 1000, "f32", False),
                                                (4, 100000, "bf16", False)])
def test_only_a_few_long_rows_into_f32_are_tiny(rows, cols, out, tiny):
    model = sum_rows(rows, cols, out)
    assert (transposed_rows(model, model.nodes[0]) is not None) is tiny


@pytest.mark.parametrize("case", list(CASES))
def test_a_pinned_transposed_column_reduction_is_proven(case):
    text, pins = CASES[case]
    model = model_of(text)
    plan = default_plan(model, TARGET, {}, pins)
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, ColumnLowering) and any(lw.kind_of(acc) == "column-row" for _, acc in lw.loads)
    assert not lw.vector_accesses()  # element by element: a warp's lanes on adjacent rows of one column
    proof = prove(model, plan, {}, trials=1)
    assert proof.ok, [o.describe() + ": " + o.detail for o in proof.violations] or proof.certificate.failure


def test_the_int32_rule_bounds_a_transposed_load_at_its_last_column_and_row():
    model = sum_rows(4, 100000)
    plan = default_plan(model, TARGET, {}, {"family": "columns"})
    texts = [o.describe() for o in obligations(model, plan)]
    assert any("offset column·#I + row at the last column and row" in t for t in texts), texts


def test_the_search_offers_the_column_family_for_a_few_long_rows_only():
    for rows, offered in ((4, True), (64, False)):
        model = sum_rows(rows, 100000)
        (region,) = default_regions(model)
        sizes = {e.name: e.size for e in model.extents}
        kinds = {type(k) for k in region_space(model, region, TARGET, sizes)}
        assert (ColumnKernel in kinds) is offered and RowKernel in kinds, rows  # the row kernel stays a candidate


def test_the_columns_pin_on_a_model_without_a_transposed_reduction_is_a_usage_error():
    model = model_of("64 EXTENT: #R  4096 EXTENT: #C  f32 TENSOR: X ( #R #C )  f32 TENSOR: Y ( #R #C )\n"
                     "MODEL: T  Y[r c] = X[r c] · 2 ;\n")
    with pytest.raises(UsageError, match="family=columns"):
        default_plan(model, TARGET, {}, {"family": "columns"})


def test_regression_a_few_long_rows_are_a_column_kernel_not_one_block_per_row():
    """4 rows of 100000 summed: the default was a row kernel of 4 blocks; it is a column kernel whose
    rows split over the grid (GPU exact run: tests/gpu/test_tiny_rows.py). Many rows keep the row
    kernel, and so does an intermediate statistic (its element type is the plan's storage choice; the
    splits combine atomically into an f32 output only): with the row that reads it, one row kernel
    (`habu.plan.row_fusion.statistic_then_row`)."""
    assert [r.kind for r in default_regions(sum_rows(4, 100000))] == ["columns"]
    assert [r.kind for r in default_regions(sum_rows(64, 100000))] == ["rows"]
    softmax = model_of("2 EXTENT: #B  100000 EXTENT: #I  f32 TENSOR: X ( #B #I )  f32 TENSOR: Y ( #B #I )\n"
                       "WORD: ROWMAX ( x[b i] -- m[b] )  m[b] = max i x[b i] ;\n"
                       "WORD: SHIFT ( x[b i] m[b] -- y[b i] )  y[b i] = exp(x[b i] - m[b]) ;\n"
                       "MODEL: T ( x -- y )  DUP ROWMAX SHIFT ;\n")
    assert [(r.kind, r.nodes) for r in default_regions(softmax)] == [("rows", ("%1", "Y"))]


def test_regression_a_sum_over_two_trailing_axes_is_a_column_kernel_not_one_thread_per_output():
    model = model_of(CASES["two-trailing-axes"][0])
    assert [r.kind for r in default_regions(model)] == ["columns"]
    assert isinstance(default_plan(model, TARGET, {}, {}).kernels[0], ColumnKernel)
