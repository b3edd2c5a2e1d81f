"""The online-softmax rewrite: matched on the attention models, equal to the model in float64 at odd
sizes and tiles, proven over Z_q × GF(p), and every planted mistake rejected."""

from __future__ import annotations

import numpy as np
import pytest

from habu.plan.online_softmax import (
    OnlineSoftmaxError,
    Variant,
    applicable,
    check_online_softmax,
    match_softmax_sum,
    online_softmax,
    run_online,
)
from habu.spec.field import PrimeField
from habu.spec.parser import load_program, parse_text
from habu.spec.reference import Float64, evaluate
from tests.conftest import ROOT

ATTENTION = ROOT / "tests" / "data" / "attention"


def prefill(n_i: int, n_j: int):
    m = load_program(ATTENTION / "attention.habu").models["ATTENTION-GQA"]
    return m.with_sizes({"B": 1, "H": 2, "G": 1, "I": n_i, "J": n_j, "E": 3, "D": 2})


def decode():
    m = load_program(ATTENTION / "decode_attention.habu").models["DECODE-ATTENTION"]
    return m.with_sizes({"B": 3, "H": 2, "G": 1, "J": 17, "L": 18, "E": 3, "D": 2})


def test_matches_the_attention_models_and_not_others():
    assert applicable(prefill(5, 17)) == ["O"]
    assert applicable(decode()) == ["O"]
    parts = match_softmax_sum(decode().nodes[0])
    assert parts is not None and parts.mask is not None and parts.row_guard is not None
    plain = parse_text("4 EXTENT: #R 5 EXTENT: #C TENSOR: X ( #R #C ) TENSOR: Y ( #R #C ) "
                       "MODEL: S ( x -- y ) SOFTMAX ;").models["S"]
    assert applicable(plain) == []
    with pytest.raises(OnlineSoftmaxError, match="does not apply"):
        online_softmax(plain, "Y", 4)


@pytest.mark.parametrize(("n_i", "n_j", "tile"), [(1, 1, 4), (1, 17, 4), (17, 17, 16), (5, 17, 3), (17, 5, 2),
                                                  (4, 17, 64)])
def test_float64_tiles_equal_the_model(n_i, n_j, tile):
    m = prefill(n_i, n_j)
    rng = np.random.default_rng(n_i + 31 * n_j)
    ins = {"Q": rng.standard_normal((1, 2, n_i, 3)) * 3, "K": rng.standard_normal((1, 1, n_j, 3)) * 3,
           "V": rng.standard_normal((1, 1, n_j, 2)), "H2G": np.array([0, 0])}
    want = evaluate(m, ins)["O"]
    got = run_online(m, "O", ins, Float64(), tile)
    both_nan = np.isnan(want) & np.isnan(got)  # rows with no key (queries before the first key)
    np.testing.assert_allclose(np.where(both_nan, 0, got), np.where(both_nan, 0, want), rtol=1e-12, atol=1e-12)


def test_float64_decode_with_empty_and_short_sequences():
    m = decode()
    rng = np.random.default_rng(5)
    ins = {"Q": rng.standard_normal((3, 2, 3)), "K": rng.standard_normal((3, 1, 17, 3)),
           "V": rng.standard_normal((3, 1, 17, 2)), "H2G": np.array([0, 0]), "LEN": np.array([0, 3, 17])}
    got = run_online(m, "O", ins, Float64(), 4)
    np.testing.assert_allclose(got, evaluate(m, ins)["O"], rtol=1e-12, atol=1e-12)
    assert np.all(got[0] == 0)


@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_the_rewrite_is_proven_over_the_exp_field(which):
    m = prefill(5, 11) if which == "prefill" else decode()
    assert check_online_softmax(m, "O", tile=4) is None
    assert online_softmax(m, "O", 4).target == "O"


def test_the_uninterpreted_field_cannot_prove_it():
    """Over GF(p) with exp uninterpreted the rescales do not cancel: the rewrite needs ExpField."""
    m = prefill(3, 9)
    f = PrimeField(seed=2)
    rng = np.random.default_rng(0)
    ins = {t.name: f.random(rng, tuple(s for s in (3 if e == "I" else 9 if e == "J" else
                                                    {"B": 1, "H": 2, "G": 1, "E": 3, "D": 2}[e]
                                                    for e in t.extents)))
           for t in m.inputs if not t.is_index}
    ins["H2G"] = np.array([0, 0])
    from habu.spec.field import evaluate_field

    assert not np.array_equal(run_online(m, "O", ins, f, 4), evaluate_field(m, ins, f)["O"])


@pytest.mark.parametrize("variant", [v for v in Variant if v is not Variant.CORRECT], ids=lambda v: v.value)
@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_every_planted_mistake_is_rejected(variant, which):
    m = prefill(5, 11) if which == "prefill" else decode()
    failure = check_online_softmax(m, "O", tile=4, variant=variant)
    assert failure is not None and "O[" in failure
