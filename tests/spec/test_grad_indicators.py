"""A derived product's repeated indicators (habu/spec/grad_indicators.py): attention's dS multiplied the mask's
indicator twice; an indicator is exactly 0 or 1, so the repeats (and one a selection of the same condition
absorbs) go, and nothing else does."""

from __future__ import annotations

from habu.spec.equation import format_expr
from habu.spec.grad import derive
from habu.spec.grad_indicators import drop_repeated_indicators
from habu.spec.ir import tensors_read
from habu.spec.parser import load_program, parse_text
from tests.conftest import ROOT

TEXT = """4 EXTENT: #M 5 EXTENT: #N
f32 TENSOR: X ( #M #N ) f32 TENSOR: Y ( #M #N ) f32 TENSOR: O ( #M #N )
MODEL: TWICE    O[m n] = X[m n] · where(n ≤ m, 1, 0) · Y[m n] · where(n ≤ m, 1, 0) ;
MODEL: ABSORBED O[m n] = where(n ≤ m, X[m n], 0) · where(n ≤ m, 1, 0) ;
MODEL: OTHER    O[m n] = where(n ≤ m, 1, 0) · where(n < m, 1, 0) · X[m n] ;
MODEL: ELSE     O[m n] = where(n ≤ m, X[m n], 1) · where(n ≤ m, 1, 0) ;
"""


def rhs(name: str) -> str:
    eq = parse_text(TEXT, "i.habu").models[name].nodes[0]
    return format_expr(drop_repeated_indicators(eq.rhs))


def test_a_repeated_indicator_is_dropped_and_one_a_selection_absorbs():
    assert rhs("TWICE") == "X[m n] · where(n ≤ m, 1, 0) · Y[m n]"
    assert rhs("ABSORBED") == "where(n ≤ m, X[m n], 0)"


def test_other_conditions_and_selections_that_are_not_zero_elsewhere_stay():
    assert rhs("OTHER").count("where(") == 2
    assert rhs("ELSE").count("where(") == 2  # where(c, x, 1) is 1, not 0, where c fails


def test_attentions_derived_ds_holds_its_masks_indicator_once_a_term():
    """dS held its mask's indicator twice a term (session 63). Since session 64 dS reads P, which holds the mask
    (habu/spec/grad_cover.py): no term of the backward holds it twice."""
    model = load_program(ROOT / "examples" / "attention.habu").models["ATTENTION-GQA"]
    nodes = derive(model).model.nodes
    dq = next(eq for eq in nodes if eq.target == "dQ")
    ds = next(eq for eq in nodes if eq.target in tensors_read(dq.rhs) and eq.target.startswith("%h"))
    assert " + " in format_expr(ds.rhs)
    for eq in nodes:
        assert all(format_expr(t).count("where(") <= 1 for t in _terms(eq.rhs)), format_expr(eq.rhs)


def _terms(e):
    from habu.spec.ir import Op

    return [t for a in e.args for t in _terms(a)] if isinstance(e, Op) and e.fn == "add" else [e]
