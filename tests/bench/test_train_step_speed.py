"""habu.bench.train_step_speed's parts that need no GPU: the torch block is FFN-SKIP as the model says it, the
Habu step hands the forward's saved values and dY to the backward and returns the gradients in the inputs'
order (here with the float64 evaluator in place of the kernels, at a tiny width), and the table's lines."""

from __future__ import annotations

import pytest

from habu.bench.train_step_speed import (
    HEADER,
    grads,
    habu_step,
    inputs_for,
    rel_error,
    table_line,
    torch_block,
)
from habu.spec.grad_program import derive_model
from habu.spec.parser import parse_text
from habu.spec.reference import evaluate
from tests.conftest import ROOT

torch = pytest.importorskip("torch")
SMALL = {"B": 4, "D": 8, "H": 16}


def _program():
    text = (ROOT / "examples" / "ffn_skip.habu").read_text()
    for name, size in (("B", 128), ("D", 4096), ("H", 14336)):
        text = text.replace(f"{size} EXTENT: #{name} ", f"{SMALL[name]} EXTENT: #{name} ", 1)
    return parse_text(text)


def _evaluator(model):
    """The model's float64 semantics, called as the compiled kernels are (tensors in, tensors out)."""
    def call(**tensors):
        out = evaluate(model, {k: v.double().numpy() for k, v in tensors.items()})
        result = {k: torch.from_numpy(v.copy()) for k, v in out.items() if k in {t.name for t in model.outputs}}
        return result if len(result) > 1 else next(iter(result.values()))
    return call


def test_the_habu_step_gives_torch_autograds_gradients_of_the_torch_block():
    bw = derive_model(_program(), "FFN-SKIP")
    assert [t.name for t in bw.forward.inputs] == ["X", "W1", "B1", "W2", "B2"]
    tensors = inputs_for(SMALL["B"], 3, device="cpu", sizes=SMALL, dtype="float64")
    dy = torch.randn((SMALL["B"], SMALL["D"]), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    want = grads(torch_block, tensors, dy)
    got = habu_step(bw, _evaluator(bw.forward), type("Back", (), {"model": bw.model, "__call__": staticmethod(
        _evaluator(bw.model))})(), tensors, dy)
    assert [tuple(g.shape) for g in got] == [tuple(w.shape) for w in want]
    for g, w in zip(got, want, strict=True):
        assert rel_error(g.reshape(w.shape), w) < 1e-9


def test_the_table_prints_each_row_and_a_failure():
    row = {"tokens": 128, "habu us": 200.0, "torch eager us": 300.0, "torch.compile us": 250.0, "build_s": 12.5,
           "habu grad rel error": 1e-3, "torch eager grad rel error": 2e-3, "torch.compile grad rel error": 3e-3}
    line = table_line(row)
    assert line.split()[:6] == ["128", "200.0", "300.0", "250.0", "1.50", "1.25"] and "build 12.5 s" in line
    assert len(HEADER.split()) >= 6
    assert table_line({"tokens": 4096, "failed": "a gradient differs"}) == "  4096 FAILED: a gradient differs"
