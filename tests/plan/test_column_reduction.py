"""Which nodes the column family (habu/plan/column_reduction.py) takes."""

from __future__ import annotations


def test_regression_masked_product_30_a_column_sum_under_a_condition_is_no_column_kernel():
    """The fuzz's masked product 30 (session 63): its derived `dP[c] = Σ r where(r ≤ c + 40, …)` was offered to the
    column family, which computes no condition on indices: the field check could not evaluate the plan (a right
    plan refused at best). The node stays a general kernel's."""
    from habu.plan.column_reduction import as_column_reduction
    from habu.spec.parser import parse_text

    program = parse_text("""64 EXTENT: #N 32 EXTENT: #M
f32 TENSOR: G ( #N #M ) f32 TENSOR: P ( #M )
MODEL: MASKED  P[m] = Σ n where(n ≤ m + 40, G[n m], 0) ;
MODEL: PLAIN   P[m] = Σ n G[n m] ;
""", "columns.habu")
    assert as_column_reduction(program.models["MASKED"].nodes[0]) is None
    assert as_column_reduction(program.models["PLAIN"].nodes[0]) is not None
