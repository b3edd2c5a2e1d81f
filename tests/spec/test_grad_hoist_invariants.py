"""The derived backward computes a reduction that an enclosing sum does not move once, in a node of its own
(`hoist_statistics(..., invariant=True)`), not once an iteration of that sum. Regression: the fuzz's models 14672,
14893, 14935, 15548 and 16307 (a max of sums) had derived backwards that recomputed the max and its sums inside
their outer sums, and whose field checks passed the search's deadline (SLOW)."""

from __future__ import annotations

import pytest

import habu.spec.grad_hoist as grad_hoist
from habu.spec.grad import derive
from habu.spec.grad_check import adjoint_check, finite_difference_check
from habu.spec.ir import Load, Reduce, free_vars, walk
from habu.spec.parser import load_program, parse_text
from tests.conftest import ROOT
from tests.random_models import random_model

MAX_OF_SUMS = [9978, 14672, 14893, 14935, 15548, 16307, 18029]


def _invariants(model) -> list[str]:
    """Reductions nested in a sum or max whose variables they do not depend on (each recomputed per iteration)."""
    found = []
    for eq in model.nodes:
        stack = [(eq.rhs, frozenset())]
        while stack:
            e, enclosing = stack.pop()
            if isinstance(e, Reduce):
                if enclosing - free_vars(e) and enclosing:
                    found.append(f"{eq.target}: a {e.op} inside sums over {sorted(v.name for v in enclosing)}")
                stack.append((e.body, enclosing | frozenset(e.vars)))
            else:
                stack.extend((a, enclosing) for a in getattr(e, "args", ()))
    return found


def _model(seed: int):
    program = parse_text(random_model(seed), "fuzz.habu")
    return program.models["FZ"]


@pytest.mark.parametrize("seed", MAX_OF_SUMS)
def test_regression_max_of_sums_the_backward_computes_each_max_and_sum_once(seed):
    model = _model(seed)
    bw = derive(model)
    maxes_inside_sums = [f for f in _invariants(bw.model) if "a max inside" in f]
    assert not maxes_inside_sums, maxes_inside_sums


@pytest.mark.parametrize("seed", MAX_OF_SUMS)
def test_regression_max_of_sums_the_hoisted_backward_is_the_gradient(seed):
    model = _model(seed)
    bw = derive(model)
    assert adjoint_check(bw, model).passed
    assert finite_difference_check(bw, model).passed


def test_attentions_backward_computes_its_scores_once_not_once_a_column_of_dq():
    """dQ = Σ j (…exp(Σ e Q·K …)…) · K[b g j e]: the scores and their exp are a node over (b g r i j) that dQ reads,
    not a sum over e recomputed for each of dQ's columns e."""
    model = load_program(ROOT / "examples" / "attention.habu").models["ATTENTION-GQA"]
    bw = derive(model)
    dq = next(eq for eq in bw.model.nodes if eq.target == "dQ")
    sums = [r for r in walk(dq.rhs) if isinstance(r, Reduce)]
    assert all(len(r.vars) <= 2 for r in sums)  # Σ d j and Σ j: no Σ e inside
    assert adjoint_check(bw, model).passed


def test_an_invariant_past_the_element_limit_stays_inline(monkeypatch):
    """A node of the invariant's variables larger than INVARIANT_ELEMENTS (at the extents' largest sizes) would
    hold more memory than recomputing costs work: the reduction stays where it is."""
    monkeypatch.setattr(grad_hoist, "INVARIANT_ELEMENTS", 16)
    bw = derive(_model(16307))
    assert any("a max inside" in f for f in _invariants(bw.model))


def test_equal_computations_over_other_bound_variables_are_one_node():
    """16307's dX0 reads the inner sum at a max's variable (`max p3 T[p q s p3]`) and at its own (`T[p q s p2]`):
    one node, read at both, so every max inside an equation (not at its root) takes its body from a node."""
    from habu.spec.ir import Load

    bw = derive(_model(16307))
    inner_maxes = [(eq.target, r) for eq in bw.model.nodes for r in walk(eq.rhs)
                   if isinstance(r, Reduce) and r.op == "max" and r is not eq.rhs]
    assert inner_maxes
    assert all(isinstance(r.body, Load) for _, r in inner_maxes), [t for t, r in inner_maxes]


def test_one_node_serves_every_gradient_that_computes_it():
    """16307's four gradients all need the inner sum `Σ s2 (X0[p] − X1[q] − X2[IX0[s2] p] · X3[p2 s])` and the
    arg-max weight built on it: one node each, which dX1, dX2 and dX3 read (dX1's body is dX0's, negated)."""
    bw = derive(_model(16307))
    inner = [eq for eq in bw.model.nodes if isinstance(eq.rhs, Reduce) and eq.rhs.op == "sum"
             and {"X2", "X3"} <= {x.tensor for x in walk(eq.rhs) if hasattr(x, "tensor")}]
    assert len(inner) == 1, [eq.target for eq in inner]
    assert adjoint_check(bw, _model(16307)).passed


def test_attentions_dk_and_dv_read_the_scores_dq_made():
    """The scores' exp is a node dQ's equation makes; dK and dV read it (before sharing across the gradients each
    computed its own)."""
    model = load_program(ROOT / "examples" / "attention.habu").models["ATTENTION-GQA"]
    bw = derive(model)

    def scores(eq) -> bool:
        return any(isinstance(x, Reduce) and {"Q", "K"} <= {y.tensor for y in walk(x) if hasattr(y, "tensor")}
                   for x in walk(eq.rhs))

    assert not any(scores(eq) for eq in bw.model.nodes if eq.target in ("dK", "dV"))


def test_regression_attentions_backward_computes_its_scores_once():
    """dQ2's factor (`−div0(where(…, exp(S − R1), 0), R2²)`) was hoisted whole before dQ's equation made the
    scores' exp a node, and computed the scores a second time (session 60's note). The factor now reads that node,
    which moves before it (`reuse_later_nodes`); the backward still passes the dual-number check. (Since session 64
    dQ2 reads the forward's O instead, habu.spec.grad_reuse, and dS reads P, habu.spec.grad_cover: P is its one
    reader.)"""
    model = load_program(ROOT / "examples" / "attention.habu").models["ATTENTION-GQA"]
    bw = derive(model)

    def scores(eq) -> bool:
        return any(isinstance(x, Reduce) and {"Q", "K"} <= {y.tensor for y in walk(x) if hasattr(y, "tensor")}
                   for x in walk(eq.rhs))

    (made,) = [eq for eq in bw.model.nodes if scores(eq)]
    order = [eq.target for eq in bw.model.nodes]
    readers = [eq.target for eq in bw.model.nodes if any(isinstance(x, Load) and x.tensor == made.target
                                                         for x in walk(eq.rhs))]
    assert len(readers) >= 1 and all(order.index(made.target) < order.index(r) for r in readers)
    assert adjoint_check(bw, model).passed


def test_a_computation_is_not_shared_past_a_node_that_writes_what_it_reads():
    """Two gradients accumulated into one tensor (`dA += …` twice) and a node between them reading it: the second
    read is after more was added, so it is not the first's node."""
    from habu.spec.grad_hoist import hoist_statistics

    text = """
4 EXTENT: #M 3 EXTENT: #N
f32 TENSOR: A ( #M #N )
f32 TENSOR: B ( #M #N )
f32 TENSOR: Y ( #M #N )
MODEL: T  Y[m n] = (Σ m2 A[m2 n]) · B[m n] ;
"""
    model = parse_text(text, "t.habu").models["T"]
    from dataclasses import replace

    from habu.spec.ir import Equation, Load

    a = model.nodes[0]
    # A second node writes A (as a scatter would), then a third reads the same Σ m2 A[m2 n]
    write = Equation("A", a.lhs, Load("B", a.lhs))
    again = Equation("Y2", a.lhs, a.rhs)
    model = replace(model, nodes=(a, write, again))
    hoisted = hoist_statistics(model, "%t", invariant=True)
    reads = [eq for eq in hoisted.nodes if eq.target.startswith("%t")]
    assert len(reads) == 2, [eq.target for eq in hoisted.nodes]  # one node before A is written, one after


def test_regression_fuzz_18029_a_row_statistic_inside_another_sum_is_that_sums_invariant():
    """`Y[p s q] = max q5 (Σ p6 erf(X0[p6]))`: dX0[p]'s arg-max weight depends on no index, which for a 1-D node is a
    row statistic a row kernel computes in place; but it sat inside dX0's sum over (p2 s q q2), recomputed (with its
    own max and count over #Q) once an iteration, and the field check passed the deadline. Inside a sum over other
    variables it is hoisted."""
    bw = derive(_model(18029))
    dx0 = next(eq for eq in bw.model.nodes if eq.target == "dX0")
    inner = [r for r in walk(dx0.rhs) if isinstance(r, Reduce) and r is not dx0.rhs]
    assert all(r.op == "sum" and not any(isinstance(x, Reduce) for x in walk(r.body)) for r in inner), dx0


def test_a_hoisted_node_reads_a_later_node_only_where_nothing_between_writes_what_it_reads():
    """`reuse_later_nodes` on hand-made nodes: %s1 holds exp(Σ c2 T[r c2]) inside it and %s3 is exactly that.
    With nothing between them writing T, %s1 reads %s3, which moves before it; with a node between that writes T,
    %s3 computes the sum on T's new values and %s1 keeps its own copy (planted without that condition, the first
    rewrites it)."""
    from habu.spec.ir import Const, Equation, IndexVar, Op

    r, c, c2 = IndexVar("r", "R"), IndexVar("c", "C"), IndexVar("c2", "C")
    inner = Op("exp", (Reduce("sum", (c2,), Load("T", (r, c2))),))
    first = Equation("%s1", (r, c), Op("mul", (inner, Load("X", (r, c)))))
    writes_t = Equation("T", (r, c), Op("add", (Load("X", (r, c)), Const(1.0))))
    other = Equation("Y", (r, c), Load("X", (r, c)))
    later = Equation("%s3", (r,), inner)
    out = grad_hoist.reuse_later_nodes([first, other, later], {"%s1", "%s3"})
    assert [n.target for n in out] == ["%s3", "%s1", "Y"]
    assert out[1].rhs == Op("mul", (Load("%s3", (r,)), Load("X", (r, c))))
    kept = grad_hoist.reuse_later_nodes([first, writes_t, later], {"%s1", "%s3"})
    assert list(kept) == [first, writes_t, later]


@pytest.mark.parametrize("seed", [18703, 18891])
def test_regression_a_node_two_earlier_nodes_read_moves_before_both(seed):
    """Fuzz models 18703 and 18891: two earlier hoisted nodes made the computation a later node makes; the later
    node moved before the first, then before the second, and the first read it before it was written ("%h2 reads
    %h4, which is neither an input nor written before it"). Every node now reads only what an earlier one writes."""
    model = _model(seed)
    bw = derive(model)
    written = {t.name for t in bw.model.inputs}
    for eq in bw.model.nodes:
        assert {x.tensor for x in walk(eq.rhs) if isinstance(x, Load)} <= written | {eq.target}, eq.target
        written.add(eq.target)
    assert adjoint_check(bw, model).passed
