"""Finding the library's words inside a model's equations, so the torch baseline runs them as the
expert's calls (F.rms_norm, torch.softmax, F.gelu) and not as a chain of elementwise kernels."""

from __future__ import annotations

import pytest

from habu.timing.experts import _eps, find, patterns
from habu.timing.torch_eager import describe, experts_in
from tests.conftest import ROOT, parse

HEAD = """
64 EXTENT: #R
32 EXTENT: #D
bf16 TENSOR: X ( #R #D )
bf16 TENSOR: Y ( #R #D )
"""


def node_words(text: str, name: str = "M") -> list[str | None]:
    model = parse(HEAD + text).models[name]
    return [(m.word if (m := find(eq.rhs)) else None) for eq in model.nodes]


def test_every_library_word_pattern_is_read_from_the_prelude():
    assert [p.word for p in patterns()] == ["RMSNORM", "RMSNORM-W", "LAYERNORM", "SOFTMAX", "GELU", "GELU-TANH",
                                             "SILU"]
    assert _eps("RMSNORM") == 1e-6 and _eps("LAYERNORM") == 1e-5


def test_an_rmsnorm_written_as_an_equation_is_the_library_word():
    assert node_words("MODEL: M  Y[r d] = X[r d] · rsqrt( Σ d' X[r d'] · X[r d'] / #D + 0.000001 ) ;") == ["RMSNORM"]


def test_an_rmsnorm_with_another_epsilon_is_not_the_word():
    assert node_words("MODEL: M  Y[r d] = X[r d] · rsqrt( Σ d' X[r d'] · X[r d'] / #D + 0.00001 ) ;") == [None]


def test_a_norm_over_the_columns_is_not_the_row_word():
    text = """64 EXTENT: #I
64 EXTENT: #J
bf16 TENSOR: Z ( #I #J )
bf16 TENSOR: Q ( #I #J )
MODEL: M  Q[i j] = Z[i j] · rsqrt( Σ i' Z[i' j] · Z[i' j] / #I + 0.000001 ) ;"""
    assert node_words(text) == [None]


def test_a_norm_of_another_tensor_is_not_the_word():
    text = """bf16 TENSOR: Z ( #R #D )
MODEL: M  Y[r d] = Z[r d] · rsqrt( Σ d' X[r d'] · X[r d'] / #D + 0.000001 ) ;"""
    assert node_words(text) == [None]


def test_gelu_of_a_compound_expression_binds_the_whole_subexpression():
    text = "bf16 TENSOR: Z ( #R #D )\nMODEL: M ( x z -- y ) ADD GELU ;"
    model = parse(HEAD + text).models["M"]
    words = [m for eq in model.nodes if (m := find(eq.rhs))]
    assert [m.word for m in words] == ["GELU"]
    assert "X" in words[0].wild


def test_a_gelu_with_one_constant_changed_is_not_the_word():
    text = "MODEL: M  Y[r d] = 0.5 · X[r d] · (1 + erf(X[r d] · 0.7071)) ;"
    assert node_words(text) == [None]


def test_the_examples_name_the_expert_calls_their_baseline_takes():
    from habu.spec.parser import load_program

    def used(path: str, name: str) -> list[str]:
        return experts_in(load_program(ROOT / "examples" / path).models[name])

    assert used("rmsnorm_linear.habu", "RMSNORM-LINEAR") == ["RMSNORM"]
    assert used("softmax.habu", "SOFTMAX-ROWS") == ["SOFTMAX"]
    assert used("ffn_skip.habu", "FFN-SKIP") == ["GELU", "RMSNORM"]
    assert used("ggemm.habu", "GGEMM") == []


def test_the_eager_baseline_says_which_expert_calls_it_takes():
    from habu.spec.parser import load_program

    model = load_program(ROOT / "examples" / "rmsnorm_linear.habu").models["RMSNORM-LINEAR"]
    assert describe(model) == "torch eager (2 equations; RMSNORM as F.rms_norm)"


class _Recorder:
    """A stand-in for torch and torch.nn.functional that records which call ran, with what."""

    def __init__(self):
        self.calls = []
        self.nn = type("nn", (), {"functional": self})()

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, kwargs))
            return args[0]
        return call


class _Data:
    def __init__(self, shape):
        self.shape = shape

    def permute(self, *order):
        return _Data(tuple(self.shape[i] for i in order))

    def reshape(self, *shape):
        return self


@pytest.mark.parametrize("word,call,kwargs", [("RMSNORM", "rms_norm", {"eps": 1e-6}),
                                              ("RMSNORM-W", "rms_norm", {"eps": 1e-6}),
                                              ("LAYERNORM", "layer_norm", {"eps": 1e-5}),
                                              ("SOFTMAX", "softmax", {"dim": -1}),
                                              ("GELU", "gelu", {}), ("GELU-TANH", "gelu", {"approximate": "tanh"}),
                                              ("SILU", "silu", {})])
def test_regression_each_word_takes_its_own_expert_call(word, call, kwargs, monkeypatch):
    """SOFTMAX asked for an epsilon it does not have (ValueError on the H200, 2026-11-30)."""
    import sys

    from habu.spec.evaluate import Labelled
    from habu.timing.experts import expert_call

    fake = _Recorder()
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setitem(sys.modules, "torch.nn", fake.nn)
    monkeypatch.setitem(sys.modules, "torch.nn.functional", fake)
    pattern = next(p for p in patterns() if p.word == word)
    m = find(pattern.rhs)
    assert m is not None and m.word == word
    args = {k: Labelled(_Data((4, 8)), pattern.lhs) for k in m.wild}
    expert_call(m, args, fake)
    ((name, got),) = fake.calls
    assert name == call and {k: v for k, v in got.items() if k != "weight"} == kwargs
