"""The derived backward computes a reduction that an enclosing sum does not move once, in a node of its own
(`hoist_statistics(..., invariant=True)`), not once an iteration of that sum. Regression: the fuzz's models 14672,
14893, 14935, 15548 and 16307 (a max of sums) had derived backwards that recomputed the max and its sums inside
their outer sums, and whose field checks passed the search's deadline (SLOW)."""

from __future__ import annotations

import pytest

import habu.spec.grad_hoist as grad_hoist
from habu.spec.grad import derive
from habu.spec.grad_check import adjoint_check, finite_difference_check
from habu.spec.ir import Reduce, free_vars, walk
from habu.spec.parser import load_program, parse_text
from tests.conftest import ROOT
from tests.random_models import random_model

MAX_OF_SUMS = [9978, 14672, 14893, 14935, 15548, 16307]


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
