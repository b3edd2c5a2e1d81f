"""The language of an MoE FFN: a MODEL of several equations sharing intermediates, a grouping
(`GROUPS: E ( #R #G )`: rows sorted by group, groups may be empty), the expert's weights gathered per
row (`W1[E[r] h d]`) and the scatter combine, checked and evaluated in float64 and over GF(p)."""

from __future__ import annotations

import numpy as np
import pytest

from habu.errors import HabuError
from habu.prove.virtual import GroupedVirtualTensor, key_for
from habu.spec.evaluate import EvalError, Evaluator
from habu.spec.field import PrimeField
from habu.spec.parser import parse_text
from habu.spec.reference import evaluate
from tests.conftest import ERROR_HEAD

DECLS = """\
1..64 EXTENT: #T  1..128 EXTENT: #R  4 EXTENT: #E  8 EXTENT: #D  6 EXTENT: #H
bf16 TENSOR: X ( #T #D )  bf16 TENSOR: W1 ( #E #H #D )  bf16 TENSOR: W3 ( #E #H #D )
bf16 TENSOR: W2 ( #E #D #H )  f32 TENSOR: P ( #R )  f32 TENSOR: Y ( #T #D )
ITENSOR: IX ( #R #T )
GROUPS: E ( #R #E )
"""
MOE = """MODEL: MOE
   gate[r h] = Σ d X[IX[r] d] · W1[E[r] h d]
   up[r h]   = Σ d X[IX[r] d] · W3[E[r] h d]
   act[r h]  = gate[r h] · sigmoid(gate[r h]) · up[r h]
   Y[IX[r] d] += P[r] · Σ h act[r h] · W2[E[r] d h] ;
"""


def moe(decls: str = DECLS, body: str = MOE):
    return parse_text(decls + body, "moe.habu").models["MOE"]


def refusal(decls: str, body: str) -> HabuError:
    with pytest.raises(HabuError) as info:
        moe(decls, body)
    text = info.value.render()
    head = ERROR_HEAD.match(text.splitlines()[0])
    assert head and head.group("path") == "moe.habu", text
    return info.value


def test_a_model_of_several_equations_has_their_targets_as_intermediates():
    m = moe()
    assert [eq.target for eq in m.nodes] == ["gate", "up", "act", "Y"]
    assert [t.name for t in m.intermediates] == ["gate", "up", "act"]
    assert [t.extents for t in m.intermediates] == [("R", "H")] * 3
    assert all(t.dtype is None for t in m.intermediates)  # the plan chooses their storage
    assert [t.name for t in m.outputs] == ["Y"]
    assert {t.name for t in m.inputs} == {"X", "IX", "W1", "E", "W3", "P", "W2", "Y"}
    assert m.nodes[-1].scatter is not None


def test_a_grouping_is_an_index_tensor_that_never_decreases():
    m = moe()
    e = m.tensor("E")
    assert e.is_index and e.grouped and e.extents == ("R",) and e.range == "E"
    assert not m.tensor("IX").grouped
    (ob,) = [o for o in m.obligations if o.kind == "grouped"]
    assert ob.tensor == "E" and "never decrease" in ob.text and "may be empty" in ob.text
    plain = moe(DECLS.replace("GROUPS: E", "ITENSOR: E"))
    assert plain.canonical_hash() != m.canonical_hash()


def test_the_names_of_intermediates_do_not_change_the_hash():
    renamed = MOE.replace("gate", "g1").replace("act", "a1")
    assert moe(body=renamed).canonical_hash() == moe().canonical_hash()


@pytest.mark.parametrize("decls,body,fragment", [
    (DECLS.replace("GROUPS: E ( #R #E )", "GROUPS: E ( #R #T #E )"), MOE, "GROUPS: E takes the extent of its rows"),
    (DECLS, MOE.replace("   up[r h]   = Σ d X[IX[r] d] · W3[E[r] h d]\n", "   up[r h] = Σ d X[IX[r] d] · W3[E[r] h d]\n"
                        "   spare[r h] = gate[r h]\n"), "intermediate spare is never read"),
    (DECLS, MOE.replace("act[r h]  = gate", "act[r h] += gate"), "act is an intermediate of MOE: define it with ="),
    (DECLS, MOE.replace("gate[r h] = Σ", "r[r h] = Σ").replace("gate[r h]", "r[r h]"), "r is an index variable"),
    (DECLS, MOE.replace("act[r h]  =", "act[r k] ="), "'k' is not an index variable"),
    (DECLS, MOE.replace("Σ h act[r h]", "Σ h act2[r h]"), "unknown tensor act2"),
    (DECLS, MOE.replace("W1[E[r] h d]", "W1[IX[r] h d]"), "W1's index 1 is over #E"),
])
def test_moe_mistakes_are_refused_at_their_place(decls, body, fragment):
    err = refusal(decls, body)
    assert fragment in err.render(), err.render()


def routed(rng, tokens: int, topk: int, experts: int, empty: set[int]):
    """Top-k routing with some experts chosen by no token, sorted by expert."""
    live = [e for e in range(experts) if e not in empty]
    choice = np.stack([rng.choice(live, topk, replace=False) for _ in range(tokens)])
    token = np.repeat(np.arange(tokens), topk)
    expert = choice.ravel()
    order = np.argsort(expert, kind="stable")
    return token[order], expert[order]


def loop_over_experts(x, w1, w3, w2, p, y, ix, e):
    out = y.astype(np.float64).copy()
    for g in range(w1.shape[0]):
        rows = np.flatnonzero(e == g)
        if not len(rows):
            continue
        xs = x[ix[rows]]
        gate, up = xs @ w1[g].T, xs @ w3[g].T
        act = gate / (1 + np.exp(-gate)) * up
        np.add.at(out, ix[rows], p[rows, None] * (act @ w2[g].T))
    return out


def test_the_float64_evaluator_agrees_with_a_loop_over_experts_with_empty_experts():
    rng = np.random.default_rng(0)
    ix, e = routed(rng, 10, 2, 4, empty={0, 2})  # the first expert and an inner one get no token
    x = rng.standard_normal((10, 8))
    w1, w3, w2 = rng.standard_normal((4, 6, 8)), rng.standard_normal((4, 6, 8)), rng.standard_normal((4, 8, 6))
    p, y = rng.random(20), rng.standard_normal((10, 8))
    got = evaluate(moe(), {"X": x, "W1": w1, "W3": w3, "W2": w2, "P": p, "Y": y, "IX": ix, "E": e})["Y"]
    np.testing.assert_allclose(got, loop_over_experts(x, w1, w3, w2, p, y, ix, e), rtol=1e-12, atol=1e-12)


def test_rows_out_of_group_order_are_an_eval_error_naming_the_grouping():
    rng = np.random.default_rng(1)
    ix, e = routed(rng, 4, 2, 4, empty=set())
    e = e[::-1].copy()
    inputs = {"X": np.ones((4, 8)), "W1": np.ones((4, 6, 8)), "W3": np.ones((4, 6, 8)), "W2": np.ones((4, 8, 6)),
              "P": np.ones(8), "Y": np.zeros((4, 8)), "IX": ix, "E": e}
    with pytest.raises(EvalError, match=r"E is a grouping \(GROUPS:\) and its values never decrease"):
        evaluate(moe(), inputs)


def test_the_gf_p_evaluator_runs_the_moe_with_a_grouping_drawn_with_empty_groups():
    f = PrimeField()
    key = key_for(5, "E")
    grouping = GroupedVirtualTensor("E", (40,), 4, key)
    values = grouping.materialize()
    assert np.all(np.diff(values) >= 0) and values[-1] == 3 and values.min() >= 0
    rng = np.random.default_rng(2)
    sizes = {"T": 20, "R": 40, "E": 4, "D": 8, "H": 6}
    inputs = {n: rng.integers(0, f.p, s) for n, s in
              {"X": (20, 8), "W1": (4, 6, 8), "W3": (4, 6, 8), "W2": (4, 8, 6), "P": (40,), "Y": (20, 8)}.items()}
    inputs["IX"], inputs["E"] = rng.integers(0, 20, 40), values
    out = Evaluator(moe(), sizes, f).run(inputs)["Y"]
    assert out.shape == (20, 8) and out.min() >= 0 and out.max() < f.p


def test_some_trials_leave_groups_empty_including_the_first():
    draws = [np.unique(GroupedVirtualTensor("E", (64,), 8, key_for(s, "E")).materialize()) for s in range(20)]
    assert all(d[-1] == 7 for d in draws)  # the last group always has rows
    assert any(len(d) < 8 for d in draws) and any(0 not in d for d in draws)


def test_regression_a_scatter_of_an_intermediate_is_not_folded_into_a_copy():
    """The builder folded `T[v] = tmp[v]` into tmp's producer, and took `Y[IX[r] n] += act[r n]` for
    such a copy: the model wrote Y[r n] = X·X, scatter dropped."""
    m = parse_text("6 EXTENT: #T  10 EXTENT: #R  4 EXTENT: #N\n"
                   "f32 TENSOR: X ( #R #N )  f32 TENSOR: Y ( #T #N )  ITENSOR: IX ( #R #T )\n"
                   "MODEL: S  act[r n] = X[r n] · X[r n]\n  Y[IX[r] n] += act[r n] ;\n", "s.habu").models["S"]
    assert [eq.target for eq in m.nodes] == ["act", "Y"] and m.nodes[1].scatter is not None


@pytest.mark.parametrize("limit", [1, 7, 1 << 24])
def test_regression_a_gathered_weight_is_contracted_in_slices_of_its_rows_with_the_same_values(limit, monkeypatch):
    """The Mixtral backward's reference held #R · #D · #H gathered weights at once (5 · 3072 · 14336 at its witness,
    and the exact product's limbs four times that: the check ran out of 24 GB). A contraction whose gathered factor
    is larger than `SLICE_ELEMENTS` runs over slices of the gathering variable's values: the same values, in the
    field and in float64, with a row box (a later kernel's demand) kept."""
    import habu.spec.evaluate as ev

    f = PrimeField()
    rng = np.random.default_rng(3)
    sizes = {"T": 20, "R": 40, "E": 4, "D": 8, "H": 6}
    inputs = {n: rng.integers(0, f.p, s) for n, s in
              {"X": (20, 8), "W1": (4, 6, 8), "W3": (4, 6, 8), "W2": (4, 8, 6), "P": (40,), "Y": (20, 8)}.items()}
    inputs["IX"] = rng.integers(0, 20, 40)
    inputs["E"] = np.sort(rng.integers(0, 4, 40))
    want = Evaluator(moe(), sizes, f).run(inputs)["Y"]
    floats = {k: (v % 7).astype(np.float64) if k not in ("IX", "E") else v for k, v in inputs.items()}
    want64 = evaluate(moe(), floats)["Y"]
    monkeypatch.setattr(ev, "SLICE_ELEMENTS", limit)
    np.testing.assert_array_equal(Evaluator(moe(), sizes, f).run(inputs)["Y"], want)
    np.testing.assert_array_equal(evaluate(moe(), floats)["Y"], want64)
