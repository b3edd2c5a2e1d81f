"""The three programs of the seed ("Why Habu") work exactly as written there."""

from __future__ import annotations

import math

import numpy as np
import pytest

from habu.spec.parser import load_program
from habu.spec.reference import evaluate
from tests.conftest import ROOT, SEEDS, SHARED_SEED

SEED_FILES = ["ggemm.habu", "ffn_skip.habu", "fused_word.habu"]


@pytest.mark.parametrize("name", SEED_FILES)
def test_fixture_is_the_seed_text_verbatim(name):
    if not SHARED_SEED.exists():
        pytest.skip("../shared/seeds is not beside this checkout")
    text = (SEEDS / name).read_text().strip()
    assert text in SHARED_SEED.read_text()


def test_seed_ggemm_parses_and_computes_a_gathered_gemm():
    program = load_program(SEEDS / "ggemm.habu")
    model = program.models["GGEMM"]
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((128, 32)), rng.standard_normal((64, 32))
    ix = rng.integers(0, 128, 128)
    out = evaluate(model, {"A": a, "B": b, "IX": ix})["O"]
    np.testing.assert_allclose(out, np.einsum("mk,nk->mn", a[ix], b), rtol=1e-10, atol=1e-10)
    assert [t.name for t in model.inputs] == ["A", "IX", "B"]
    assert any(ob.kind == "index-range" and ob.tensor == "IX" for ob in model.obligations)


def test_seed_ggemm_tensor_words_have_the_seed_effects():
    program = load_program(SEEDS / "ggemm.habu")
    assert program.words["A@"].effect_text() == "( ix<#M> ix<#K> -- r )"
    assert program.words["B@"].effect_text() == "( ix<#N> ix<#K> -- r )"
    assert program.words["O!"].effect_text() == "( r ix<#M> ix<#N> -- )"
    assert program.words["IX@"].effect_text() == "( ix<#M> -- ix<#M> )"


def _gelu(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def test_seed_ffn_skip_composes_and_matches_numpy():
    program = load_program(SEEDS / "ffn_skip.habu")
    model = program.models["FFN-SKIP"]
    rng = np.random.default_rng(3)
    x, w1, b1 = rng.standard_normal((128, 8)), rng.standard_normal((8, 16)), rng.standard_normal((1, 16))
    w2, b2 = rng.standard_normal((16, 8)), rng.standard_normal((1, 8))
    y = evaluate(model, {"X": x, "W1": w1, "B1": b1, "W2": w2, "B2": b2})["Y"]
    h = _gelu(x @ w1 + b1) @ w2 + b2 + x
    expect = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, expect, rtol=1e-10, atol=1e-12)
    assert [t.name for t in model.outputs] == ["Y"]
    assert len(model.nodes) == 7


def test_seed_fused_word_is_in_the_example_verbatim_and_computes_relu_axpy():
    text = (SEEDS / "fused_word.habu").read_text().strip()
    example = (ROOT / "examples" / "fused.habu").read_text()
    assert text in example
    program = load_program(ROOT / "examples" / "fused.habu")
    model = program.models["AXPY-RELU"].with_sizes({"N": 64})
    rng = np.random.default_rng(1)
    x, y, a = rng.standard_normal(64), rng.standard_normal(64), np.asarray(rng.standard_normal())
    out = evaluate(model, {"x": x, "y": y, "a": a})["y"]
    np.testing.assert_allclose(out, np.maximum(a * x + y, 0))
    assert {t.name for t in model.inputs} == {"x", "y", "a"}
