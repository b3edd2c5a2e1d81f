"""Sum–product factoring of a gradient's terms (habu.spec.grad_factor) and the computations the backward shares
(habu.spec.grad_hoist.share_computations): attention's derived backward in FlashAttention-2's form."""

from __future__ import annotations

import pytest

from habu.spec.grad import derive
from habu.spec.grad_check import adjoint_check, finite_difference_check
from habu.spec.grad_factor import factor_sum, factors, merge_terms
from habu.spec.ir import IndexVar, Load, Op, Reduce, free_vars, walk
from habu.spec.parser import load_program
from tests.conftest import ROOT

i, j, d, e, n = (IndexVar(x, f"#{x.upper()}") for x in "ijden")
SIZES = {"#I": 40, "#J": 72, "#D": 16, "#E": 16, "#N": 64}


def size(v: IndexVar) -> int:
    return SIZES[v.extent]


def mul(*fs):
    out = fs[0]
    for f in fs[1:]:
        out = Op("mul", (out, f))
    return out


def test_a_factor_and_the_variables_only_it_reads_are_summed_apart():
    """Σ i d dO[i d]·V[j d]·P[i j]·Q[i e] (dK's shape): d is read by dO and V alone, so `Σ d dO·V` is a sum of its
    own, over (i, j) and computed once there, not once a column e."""
    term = Reduce("sum", (i, d), mul(Load("dO", (i, d)), Load("V", (j, d)), Load("P", (i, j)), Load("Q", (i, e))))
    got = factor_sum(term, size)
    assert isinstance(got, Reduce) and got.vars == (i,)
    (inner,) = [f for f in factors(got.body) if isinstance(f, Reduce)]
    assert inner.vars == (d,) and free_vars(inner) == {i, j}
    assert {f.tensor for f in factors(got.body) if isinstance(f, Load)} == {"P", "Q"}


def test_of_two_factorings_the_smaller_inner_sum_is_taken():
    """Σ i d X[i d]·Y[j d]·Z[i e]: summing d first makes a node over (i, j) (2880 elements), summing i first one
    over (d, e) (256): the second."""
    term = Reduce("sum", (i, d), mul(Load("X", (i, d)), Load("Y", (j, d)), Load("Z", (i, e))))
    got = factor_sum(term, size)
    (inner,) = [f for f in factors(got.body) if isinstance(f, Reduce)]
    assert inner.vars == (i,) and free_vars(inner) == {d, e}


@pytest.mark.parametrize("term", [
    # a product: every factor reads the bound variable
    Reduce("sum", (n,), mul(Load("dY", (i, n)), Load("W", (n, e)))),
    # a factor of the term's own variables stays inside: pulling A[i] out would leave nothing outside
    Reduce("sum", (d,), mul(Load("A", (i,)), Load("B", (j, d)))),
    # the inner sum would be computed at every point the outer one is: nothing saved
    Reduce("sum", (d, n), mul(Load("A", (i, d)), Load("B", (i, d, n)))),
])
def test_a_term_with_nothing_to_save_comes_back_as_it_is(term):
    assert factor_sum(term, size) == term


def _dp(row: IndexVar, col: IndexVar, name: str) -> Reduce:
    dv = IndexVar(name, "#D")
    return Reduce("sum", (dv,), mul(Load("dO", (row, dv)), Load("V", (col, dv))))


def test_two_terms_that_contract_one_operand_alike_become_one_sum():
    """Σ j A·K[j e] + Σ j2 B·K[j2 e], A and B each holding a sum: Σ j (A + B)·K[j e] (FlashAttention-2's dS)."""
    j2 = IndexVar("j2", "#J")
    a = Reduce("sum", (j,), mul(_dp(i, j, "d1"), Load("K", (j, e))))
    b = Reduce("sum", (j2,), mul(Load("D", (i,)), _dp(i, j2, "d2"), Load("K", (j2, e))))
    (got,) = merge_terms([a, b])
    assert isinstance(got, Reduce) and got.vars == (j,)
    assert Load("K", (j, e)) in factors(got.body)
    assert not any(j2 in free_vars(x) for x in walk(got))


J2 = IndexVar("j2", "#J")


@pytest.mark.parametrize(("first", "second"), [
    # cofactors without a reduction: (dY + dZ) would keep the contraction path from the product
    (Reduce("sum", (j,), mul(Load("R", (i,)), Load("dY", (i, j)), Load("K", (j, e)))),
     Reduce("sum", (J2,), mul(Load("R", (i,)), Load("dZ", (i, J2)), Load("K", (J2, e))))),
    # the operand read at other places
    (Reduce("sum", (j,), mul(_dp(i, j, "d1"), Load("K", (j, e)))),
     Reduce("sum", (J2,), mul(_dp(i, J2, "d2"), Load("K", (e, J2))))),
    # the operand read alike at the bound variable but at another free one
    (Reduce("sum", (j,), mul(_dp(i, j, "d1"), Load("K", (j, e)))),
     Reduce("sum", (J2,), mul(_dp(n, J2, "d2"), Load("K", (J2, i))))),
    # the second's cofactor binds the first's variable: renamed onto it, Z[j J2] would read Z[j j]
    (Reduce("sum", (j,), mul(_dp(i, j, "d1"), Load("K", (j, e)))),
     Reduce("sum", (J2,), mul(Reduce("sum", (j,), mul(Load("Y", (i, j)), Load("Z", (j, J2)))), Load("K", (J2, e))))),
    # another operand
    (Reduce("sum", (j,), mul(_dp(i, j, "d1"), Load("K", (j, e)))),
     Reduce("sum", (J2,), mul(_dp(i, J2, "d2"), Load("Q", (J2, e))))),
])
def test_terms_that_do_not_contract_one_operand_alike_stay_apart(first, second):
    assert merge_terms([first, second]) == [first, second]


def _attention(path: str, name: str):
    model = load_program(ROOT / "examples" / path).models[name]
    return model, derive(model)


@pytest.mark.parametrize(("path", "name"), [("attention.habu", "ATTENTION-GQA"),
                                            ("decode_attention.habu", "DECODE-ATTENTION")])
def test_regression_attentions_dk_recomputed_dp_for_every_column(path, name):
    """Attention's dK was `Σ r i d dO·V·(…)·Q + Σ r i (…)·Q`, `Σ d dO·V` recomputed for each of its elements
    (a general kernel the cost model put at 144 ms at the example's sizes). Now dQ = Σ j dS·K and dK = Σ (r, i)
    dS·Q read one dS node, the scores are made by one node, and the backward is still the gradient."""
    model, bw = _attention(path, name)
    nodes = {eq.target: eq for eq in bw.model.nodes}
    for grad, partner in (("dQ", "K"), ("dK", "Q")):
        rhs = nodes[grad].rhs
        assert isinstance(rhs, Reduce), grad
        loads = [f for f in factors(rhs.body) if isinstance(f, Load)]
        assert {x.tensor for x in loads} >= {partner} and len(loads) == 2, grad
    ds = {x.tensor for g in ("dQ", "dK") for x in factors(nodes[g].rhs.body) if x.tensor not in ("Q", "K")}
    assert len(ds) == 1
    scores = [eq.target for eq in bw.model.nodes
              if any(isinstance(x, Reduce) and {"Q", "K"} <= {y.tensor for y in walk(x) if isinstance(y, Load)}
                     for x in walk(eq.rhs))]
    assert len(scores) == 1
    assert adjoint_check(bw, model).passed
    assert finite_difference_check(bw, model).passed


def test_a_shared_computation_takes_its_first_readers_order():
    """The node made for the scores' exp is over its first reader's variables in that reader's order (a row of
    the scores contiguous), not over the order the variables first appear in it."""
    _, bw = _attention("attention.habu", "ATTENTION-GQA")
    nodes = list(bw.model.nodes)
    made = next(eq for eq in nodes if isinstance(eq.rhs, Op) and eq.rhs.fn == "exp")
    reader = next(eq for eq in nodes[nodes.index(made) + 1:]
                  if any(isinstance(x, Load) and x.tensor == made.target for x in walk(eq.rhs)))
    (read,) = [x for x in walk(reader.rhs) if isinstance(x, Load) and x.tensor == made.target]
    assert [v.extent for v in made.lhs] == ["B", "G", "R", "I", "J"]  # (since session 64 its reader is P, which
    assert list(read.indices) == [v for v in reader.lhs if v in set(read.indices)]  # reads it in its own order)
