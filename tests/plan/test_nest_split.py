"""`nest:T` (habu/plan/nest_split.py): a product summed over several variables, a batched contraction over one of
them (f32) and a sum over the rest; and the derived attention backward's plan that takes it (session 62: every
product of FlashAttention-2's backward a contraction). Proven like any plan; default plans take it."""

from __future__ import annotations

import pytest

from habu.lower import lower_plan
from habu.plan.nest_split import nest_part
from habu.plan.patterns import as_contraction
from habu.plan.rewrite import applicable, apply_rewrites
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.grad_program import backward_name, with_backward
from habu.spec.ir import Equation, IndexVar, Load, Op, Reduce, Size
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ROOT

TARGET = TARGETS["sm_90a"]

GROUPED = """
3 EXTENT: #R  100 EXTENT: #I  72 EXTENT: #J  64 EXTENT: #E
bf16 TENSOR: S ( #R #I #J )
bf16 TENSOR: Q ( #R #I #E )
f32 TENSOR: Y ( #J #E )
MODEL: GROUPED
  Y[j e] = Σ r i S[r i j] · Q[r i e]
;
"""


def test_a_sum_over_two_variables_becomes_a_contraction_over_the_larger_and_a_sum_over_the_other():
    model = parse_text(GROUPED, "grouped.habu").models["GROUPED"]
    assert "nest:Y" in applicable(model)
    graph = apply_rewrites(model, ("nest:Y",))
    inner, outer = (next(e for e in graph.nodes if e.target == t) for t in ("Y.in", "Y"))
    assert inner.rhs.vars[0].extent == "I" and [v.extent for v in inner.lhs] == ["R", "J", "E"]
    assert as_contraction(inner) is not None
    assert isinstance(outer.rhs, Reduce) and [v.extent for v in outer.rhs.vars] == ["R"]
    plan = default_plan(model, TARGET, None, {})
    assert "nest:Y" in plan.rewrites
    kinds = {" ".join(k.nodes): k.kind for k in plan.kernels}
    assert kinds["Y.in"] == "contraction" and dict(plan.storage)["Y.in"] == "f32"
    assert verify_plan(model, plan, None, trials=1, lowerings=lower_plan(model, plan)).passed


@pytest.mark.parametrize("text", [
    # one variable: a contraction already
    "Y[j e] = Σ i S[0 i j] · Q[0 i e]",
    # no variable makes a contraction: three loads
    "Y[j e] = Σ r i S[r i j] · Q[r i e] · Q[r i e]",
])
def test_nest_applies_only_where_a_contraction_forms(text):
    body = GROUPED.replace("Y[j e] = Σ r i S[r i j] · Q[r i e]", text)
    model = parse_text(body, "grouped.habu").models["GROUPED"]
    assert nest_part(model, "Y") is None


def test_a_scale_of_sizes_is_a_contractions_constant_factor():
    """Σ e Q·K·rsqrt(#E) (attention's scores in its derived backward) is a contraction: its scale is printed in
    the epilogue; before, only +, −, ·, / of constants were, and the scores stayed a general kernel."""
    i, j, e = (IndexVar(x, x.upper()) for x in "ije")
    body = Op("mul", (Op("mul", (Load("Q", (i, e)), Load("K", (j, e)))), Op("rsqrt", (Size("E"),))))
    assert as_contraction(Equation("S", (i, j), Reduce("sum", (e,), body))) is not None


@pytest.fixture(scope="module")
def attention_backward():
    name = backward_name("ATTENTION-GQA")
    program = with_backward(load_program(ROOT / "examples" / "attention.habu"), name)
    return program.model(name)


def test_regression_attentions_backward_ran_its_products_on_the_fma_pipes(attention_backward):
    """Session 62's first factored backward ran at 51 ms for 16 heads × 1k on an H100 (SDPA's backward: 72 µs):
    its scores (a scale `rsqrt(#E)` the contraction refused), %ds2 (`Σ d j dO·V·P′`), dK and dV (sums over r and
    i) were general kernels. Now every product is a contraction, %ds2 a row sum (since session 64 over dO·O, the
    forward's output: habu/spec/grad_reuse.py) and dS dP's epilogue, and the plan is proven."""
    model = attention_backward
    plan = default_plan(model, TARGET, None, {})
    scores = next(e.target for e in model.nodes if {"Q", "K"} <= {x.tensor for x in _loads(e.rhs)})
    ds = next(x.tensor for e in model.nodes if e.target == "dQ" for x in _loads(e.rhs) if x.tensor != "K")
    assert {"nest:dK", "nest:dV", f"split:{scores}", f"split:{ds}"} <= set(plan.rewrites)
    kinds = {k.nodes[0]: k.kind for k in plan.kernels}
    for node in (f"{scores}.mm", f"{ds}.mm", "dQ", "dK.in", "dV.in"):  # (masks, exp and P in epilogues)
        assert kinds[node] == "contraction", kinds
    d = next(e for e in model.nodes if "O" in {x.tensor for x in _loads(e.rhs)})
    assert kinds[d.target] == "rows" and {x.tensor for x in _loads(d.rhs)} == {"dO", "O"}
    assert verify_plan(model, plan, None, trials=1, lowerings=lower_plan(model, plan)).passed


def test_a_hoisted_invariant_under_a_product_takes_its_producers_layout(attention_backward):
    """dV's `%h3` under `Σ r i` was laid out [b g j r i] (the hoist's order: i, dV's contraction k, innermost;
    as they appeared, [b g j i r], it ran on the FMA pipes), and transposed the shared exp %h4[b g r i j] in a
    general kernel that read %h4 down its columns (67.6 µs of the bf16 backward's 285, H100, session 63). It now
    takes %h4's layout (habu/spec/grad_layout.py): an elementwise map over rows, and dV reads it MN-major."""
    node = next(e for e in attention_backward.nodes if e.target == "dV")
    (factor,) = [x for x in _loads(node.rhs) if x.tensor.startswith("%")]
    p = next(e for e in attention_backward.nodes if e.target == factor.tensor)
    (exp,) = [x for x in _loads(p.rhs) if x.tensor.startswith("%")]
    assert p.lhs == exp.indices and [v.extent for v in p.lhs] == ["B", "G", "R", "I", "J"]
    assert [v.extent for v in factor.indices] == ["B", "G", "R", "I", "J"]


def _loads(e):
    from habu.spec.ir import walk

    return [x for x in walk(e) if isinstance(x, Load)]


def test_regression_a_bf16_attentions_backward_kept_f32_intermediates_and_multiplied_on_the_fma_pipes():
    """Session 63 (H100, 16/8 heads × 1k): with O declared bf16, the backward took 1367 µs, its dQ, dK and dV on
    the FMA pipes: session 62's f32 saved statistics R1[b g r i], R2 (rank 4) counted as matrices of another type,
    so every intermediate was f32 (`storage=bf16` pinned: 285 µs). An f32 statistic over some of another input's
    axes no longer decides the intermediates' type; D (a statistic, `Σ d dO·O` since session 64) stays f32."""
    text = (ROOT / "examples" / "attention.habu").read_text().replace("f32  TENSOR: O", "bf16 TENSOR: O")
    name = backward_name("ATTENTION-GQA")
    model = with_backward(parse_text(text, "attention_bf16o.habu"), name).model(name)
    plan = default_plan(model, TARGET, None, {})
    storage = dict(plan.storage)
    d = next(e.target for e in model.nodes if "O" in {x.tensor for x in _loads(e.rhs)})
    assert storage[d] == "f32" and {storage[t] for t in storage if t.startswith("%h")} == {"bf16"}, storage
    products = [k for k in plan.kernels if k.kind == "contraction"]
    assert len(products) == 5 and all(k.mma != "fma" for k in products), [(k.nodes, k.mma) for k in products]
