"""Every example parses, and evaluates (at a small shape) to what an independent numpy expression gives."""

from __future__ import annotations

import math

import numpy as np
import pytest

from habu.spec.parser import load_program
from habu.spec.reference import evaluate
from tests.conftest import EXAMPLES, ROOT

erf = np.vectorize(math.erf)


def small(path: str, model: str, sizes: dict[str, int]):
    m = load_program(ROOT / "examples" / path).models[model]
    return m.with_sizes(sizes)


def rand(rng, *shape):
    return rng.standard_normal(shape)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_parses_and_has_a_model(path):
    program = load_program(path)
    assert program.models
    for m in program.models.values():
        assert m.outputs and m.nodes


def test_ggemm():
    m = small("ggemm.habu", "GGEMM", {"M": 40, "N": 24, "K": 17})
    rng = np.random.default_rng(0)
    a, b, ix = rand(rng, 40, 17), rand(rng, 24, 17), rng.integers(0, 40, 40)
    np.testing.assert_allclose(evaluate(m, {"A": a, "B": b, "IX": ix})["O"], np.einsum("mk,nk->mn", a[ix], b),
                               rtol=1e-12, atol=1e-12)


def test_moe_gather():
    m = small("moe_gather.habu", "MOE-UP", {"T": 64, "R": 32, "N": 24, "K": 16})
    rng = np.random.default_rng(1)
    x, w, ix = rand(rng, 64, 16), rand(rng, 24, 16), rng.integers(0, 64, 32)
    np.testing.assert_allclose(evaluate(m, {"X": x, "W1": w, "IX": ix})["H"], x[ix] @ w.T, rtol=1e-12, atol=1e-12)


def test_gemm():
    m = small("gemm.habu", "GEMM", {"M": 16, "N": 8, "K": 12})
    rng = np.random.default_rng(2)
    a, b = rand(rng, 16, 12), rand(rng, 8, 12)
    np.testing.assert_allclose(evaluate(m, {"A": a, "B": b})["C"], a @ b.T, rtol=1e-12, atol=1e-12)


def test_ffn_skip():
    m = small("ffn_skip.habu", "FFN-SKIP", {"B": 8, "D": 16, "H": 24})
    rng = np.random.default_rng(3)
    x, w1, b1, w2, b2 = rand(rng, 8, 16), rand(rng, 16, 24), rand(rng, 1, 24), rand(rng, 24, 16), rand(rng, 1, 16)
    h = x @ w1 + b1
    h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
    h = h @ w2 + b2 + x
    expect = h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + 1e-6)
    got = evaluate(m, {"X": x, "W1": w1, "B1": b1, "W2": w2, "B2": b2})["Y"]
    np.testing.assert_allclose(got, expect, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("model", ["RMSNORM-ROWS", "RMSNORM-EQ"])
def test_rmsnorm_with_runtime_width(model):
    m = load_program(ROOT / "examples" / "rmsnorm.habu").models[model].with_sizes({"R": 6})
    rng = np.random.default_rng(4)
    x = rand(rng, 6, 512)  # the runtime extent #D takes its size from the input
    expect = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(evaluate(m, {"X": x})["Y"], expect, rtol=1e-12)


def test_softmax():
    m = small("softmax.habu", "SOFTMAX-ROWS", {"R": 5, "C": 33})
    x = rand(np.random.default_rng(5), 5, 33) * 30
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(evaluate(m, {"X": x})["Y"], e / e.sum(axis=1, keepdims=True), rtol=1e-12)


def test_rmsnorm_linear():
    m = small("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 7, "D": 16, "N": 9})
    rng = np.random.default_rng(6)
    x, w = rand(rng, 7, 16), rand(rng, 16, 9)
    expect = (x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + 1e-6)) @ w
    np.testing.assert_allclose(evaluate(m, {"X": x, "W": w})["Y"], expect, rtol=1e-10)


def test_fused():
    m = small("fused.habu", "AXPY-RELU", {"N": 32})
    rng = np.random.default_rng(7)
    x, y, a = rand(rng, 32), rand(rng, 32), np.asarray(1.5)
    np.testing.assert_allclose(evaluate(m, {"x": x, "y": y, "a": a})["y"], np.maximum(1.5 * x + y, 0))
