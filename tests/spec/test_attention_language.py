"""Conditions on indices, where(c, x, y), −∞, softmax_j and the attention models (tests/data/attention):
parsing, errors, float64 golden values at odd sizes (against numpy written independently) and GF(p)
semantics."""

from __future__ import annotations

import numpy as np
import pytest

from habu.errors import HabuError
from habu.spec.equation import format_equation
from habu.spec.field import PrimeField, evaluate_field
from habu.spec.parser import load_program, parse_text
from habu.spec.reference import evaluate
from tests.conftest import ROOT

# the attention models; they move to examples/ once a plan computes them (issue 22, step 4)
ATTENTION = ROOT / "tests" / "data" / "attention"

HEAD = """
5 EXTENT: #I
7 EXTENT: #J
TENSOR: S ( #I #J )
TENSOR: M ( #I )
TENSOR: Y ( #I #J )
"""


def model(equation: str, head: str = HEAD):
    return next(iter(parse_text(head + equation, "t.habu").models.values()))


def attention_ref(q, k, v, h2g, allowed):
    """numpy attention: q (b h i e), k/v (b g j ·), allowed (b i j) booleans; fully masked rows are 0."""
    kk, vv = k[:, h2g], v[:, h2g]
    s = np.einsum("bhie,bhje->bhij", q, kk) / np.sqrt(q.shape[-1])
    s = np.where(allowed[:, None], s, -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    den = p.sum(-1, keepdims=True)
    out = np.einsum("bhij,bhjd->bhid", p / np.where(den > 0, den, 1), vv)
    return np.where(den > 0, out, 0.0)


@pytest.mark.parametrize(("text", "expect"), [
    ("j ≤ i", lambda i, j: j <= i), ("j <= i", lambda i, j: j <= i), ("j < i + 1", lambda i, j: j < i + 1),
    ("j ≥ i + #J − #I", lambda i, j: j >= i + 2), ("j >= 3", lambda i, j: j >= 3 + 0 * i),
    ("j > i", lambda i, j: j > i), ("i = j", lambda i, j: i == j), ("i ≠ j", lambda i, j: i != j),
    ("-j + 4 > -i", lambda i, j: 4 - j > -i),
])
def test_comparisons_select_in_float64(text, expect):
    m = model(f"MODEL: W  Y[i j] = where({text}, S[i j], 0) ;")
    s = np.arange(35.0).reshape(5, 7) + 1
    i, j = np.meshgrid(np.arange(5), np.arange(7), indexing="ij")
    np.testing.assert_array_equal(evaluate(m, {"S": s})["Y"], np.where(expect(i, j), s, 0))


def test_iverson_bracket_is_one_or_zero_and_prints_back():
    m = model("MODEL: W  M[i] = Σ j [j ≤ i] · S[i j] ;")
    s = np.arange(35.0).reshape(5, 7)
    want = np.array([s[i, : i + 1].sum() for i in range(5)])
    np.testing.assert_array_equal(evaluate(m, {"S": s})["M"], want)
    assert format_equation(m.nodes[0]) == "M[i] = Σ j [j ≤ i] · S[i j]"


def test_masked_max_with_negative_infinity():
    m = model("MODEL: W  M[i] = max j where(j ≤ i + #J − #I, S[i j], −∞) ;")
    s = np.random.default_rng(1).standard_normal((5, 7))
    want = np.array([s[i, : i + 3].max() for i in range(5)])
    np.testing.assert_array_equal(evaluate(m, {"S": s})["M"], want)
    assert format_equation(m.nodes[0]) == "M[i] = max j where(j ≤ i + #J − #I, S[i j], −∞)"


def test_field_where_is_exact_and_neg_inf_is_the_identity_of_max():
    """Over GF(p) a masked max is the max-reduction model prod(r − x) over the unmasked x only."""
    m = model("MODEL: W  M[i] = max j where(j ≤ i, S[i j], −∞) ;")
    f = PrimeField(seed=3)
    s = np.random.default_rng(2).integers(0, f.p, (5, 7))
    got = evaluate_field(m, {"S": s}, f)["M"]
    want = [f.product_last((f.max_point - s[i, : i + 1]) % f.p) for i in range(5)]
    np.testing.assert_array_equal(got, want)
    sel = model("MODEL: W  Y[i j] = where(j ≠ i, S[i j], 3) ;")
    y = evaluate_field(sel, {"S": s}, f)["Y"]
    np.testing.assert_array_equal(y, np.where(np.eye(5, 7, dtype=bool), 3, s))


def test_condition_changes_the_canonical_hash():
    a = model("MODEL: W  Y[i j] = where(j ≤ i, S[i j], 0) ;")
    b = model("MODEL: W  Y[i j] = where(j < i, S[i j], 0) ;")
    c = model("MODEL: W  Y[i2 j2] = where(j2 ≤ i2, S[i2 j2], 0) ;")
    assert a.canonical_hash() != b.canonical_hash()
    assert a.canonical_hash() == c.canonical_hash()


@pytest.mark.parametrize(("equation", "col", "message"), [
    ("MODEL: W  Y[i j] = where(S[i j], S[i j], 0) ;", 26, "S holds values, not indices"),
    ("MODEL: W  Y[i j] = where(j i, S[i j], 0) ;", 28, "expected a comparison"),
    ("MODEL: W  Y[i j] = where(#J < 3, S[i j], 0) ;", 26, "names no index"),
    ("MODEL: W  Y[i j] = where(j ≤ k, S[i j], 0) ;", 30, "'k' is not an index variable"),
    ("MODEL: W  Y[i j] = where(j ≤ i, S[i j]) ;", 39, "expected ','"),
    ("MODEL: W  Y[i j] = S[i j] + ∞ ;", 29, "only −∞ is a value"),
    ("MODEL: W  M[i] = softmax_j(S[i j]) ;", 18, "no reduction around it binds"),
    ("MODEL: W  Y[i j] = where(j ≤ i + #Q, S[i j], 0) ;", 34, "unknown extent #Q"),
])
def test_errors_name_the_place(equation, col, message):
    with pytest.raises(HabuError) as err:
        model(equation)
    text = err.value.render() if hasattr(err.value, "render") else str(err.value)
    assert message in text
    assert f"t.habu:7:{col}:" in text, text


def test_free_index_inside_a_condition_is_refused():
    with pytest.raises(HabuError, match="index j is free on the right side"):
        model("MODEL: W  M[i] = where(j ≤ i, 1, 0) ;")


def test_softmax_j_is_the_softmax_along_j():
    m = model("MODEL: W  Y[i j] = Σ j' [j' = j] · softmax_j'(S[i j']) ;")
    s = np.random.default_rng(3).standard_normal((5, 7))
    e = np.exp(s - s.max(1, keepdims=True))
    np.testing.assert_allclose(evaluate(m, {"S": s})["Y"], e / e.sum(1, keepdims=True), rtol=1e-13)


@pytest.mark.parametrize(("n_i", "n_j"), [(1, 1), (1, 17), (17, 17), (5, 17), (17, 5)])
def test_golden_causal_gqa_attention_at_odd_sizes(n_i, n_j):
    """Queries at the end of the KV sequence (query i at position i + J − I); with more queries than
    keys the first rows see no key at all: the example defines them as zeros."""
    text = (ATTENTION / "attention.habu").read_text()
    text = text.replace("MODEL: ATTENTION-GQA\n  O[b h i d] =",
                        "MODEL: ATTENTION-GQA\n  O[b h i d] = where(i + #J − #I ≥ 0,") \
        .replace("· V[b H2G[h] j d] ;", "· V[b H2G[h] j d], 0) ;")
    m = parse_text(text, "attention.habu").models["ATTENTION-GQA"]
    m = m.with_sizes({"B": 2, "H": 4, "G": 2, "I": n_i, "J": n_j, "E": 3, "D": 5})
    rng = np.random.default_rng(n_i * 100 + n_j)
    q, k, v = rng.standard_normal((2, 4, n_i, 3)), rng.standard_normal((2, 2, n_j, 3)), rng.standard_normal((2, 2, n_j, 5))
    h2g = np.array([0, 0, 1, 1])
    i, j = np.meshgrid(np.arange(n_i), np.arange(n_j), indexing="ij")
    allowed = np.broadcast_to(j <= i + n_j - n_i, (2, n_i, n_j))
    got = evaluate(m, {"Q": q, "K": k, "V": v, "H2G": h2g})["O"]
    np.testing.assert_allclose(got, attention_ref(q, k, v, h2g, allowed), rtol=1e-12, atol=1e-12)
    if n_i > n_j:
        assert np.all(got[:, :, : n_i - n_j] == 0)


def test_golden_decode_attention_with_lengths_and_an_empty_sequence():
    m = load_program(ATTENTION / "decode_attention.habu").models["DECODE-ATTENTION"]
    m = m.with_sizes({"B": 4, "H": 4, "G": 2, "J": 17, "L": 18, "E": 3, "D": 5})
    rng = np.random.default_rng(7)
    q, k, v = rng.standard_normal((4, 4, 3)), rng.standard_normal((4, 2, 17, 3)), rng.standard_normal((4, 2, 17, 5))
    h2g, lens = np.array([0, 1, 0, 1]), np.array([17, 1, 0, 9])
    allowed = np.arange(17)[None, None, :] < lens[:, None, None]
    got = evaluate(m, {"Q": q, "K": k, "V": v, "H2G": h2g, "LEN": lens})["O"]
    want = attention_ref(q[:, :, None], k, v, h2g, allowed)[:, :, 0]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.all(got[2] == 0) and not np.isnan(got).any()


def test_prelude_attention_words_match_numpy():
    text = """2 EXTENT: #B
3 EXTENT: #H
5 EXTENT: #I
17 EXTENT: #J
4 EXTENT: #E
TENSOR: Q ( #B #H #I #E )
TENSOR: K ( #B #H #J #E )
TENSOR: V ( #B #H #J #E )
TENSOR: O ( #B #H #I #E )
MODEL: A ( q k v -- o ) ATTENTION ;
MODEL: C ( q k v -- o ) ATTENTION-CAUSAL ;
"""
    models = parse_text(text, "w.habu").models
    rng = np.random.default_rng(11)
    q, k, v = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 17, 4)), rng.standard_normal((2, 3, 17, 4))
    ins = {"Q": q, "K": k, "V": v}
    i, j = np.meshgrid(np.arange(5), np.arange(17), indexing="ij")
    full = np.ones((2, 5, 17), dtype=bool)
    causal = np.broadcast_to(j <= i + 12, (2, 5, 17))
    ident = np.arange(3)
    np.testing.assert_allclose(evaluate(models["A"], ins)["O"], attention_ref(q, k, v, ident, full), rtol=1e-12)
    np.testing.assert_allclose(evaluate(models["C"], ins)["O"], attention_ref(q, k, v, ident, causal), rtol=1e-12)


def test_regression_a_condition_on_extent_sizes_keeps_the_model_name():
    """The builder's loop over a condition's extents once reused the name `name`, renaming the model
    after the last extent (MODEL ATTENTION-GQA came out as MODEL I)."""
    m = load_program(ATTENTION / "attention.habu").models["ATTENTION-GQA"]
    assert m.name == "ATTENTION-GQA" and {"I", "J"} <= {e.name for e in m.extents}
