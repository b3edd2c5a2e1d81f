"""Models run as torch eager ops: the output against the float64 reference, on fresh random inputs,
for each example model that is not one contraction, at a small, ragged shape."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.spec.parser import load_program  # noqa: E402
from habu.timing.harness import compare, make_inputs, reference, tolerance  # noqa: E402
from habu.timing.torch_eager import eager_baseline  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

CASES = [
    ("rmsnorm_linear.habu", "RMSNORM-LINEAR", {"T": 300, "D": 1024, "N": 520}),
    ("rmsnorm.habu", "RMSNORM-ROWS", {"R": 100, "D": 768}),
    ("rmsnorm.habu", "RMSNORM-EQ", {"R": 100, "D": 768}),
    ("softmax.habu", "SOFTMAX-ROWS", {"R": 64, "C": 1000}),
    ("ffn_skip.habu", "FFN-SKIP", {"B": 16, "D": 256, "H": 520}),
    ("fused.habu", "AXPY-RELU", {"N": 100_000}),
]


@pytest.mark.parametrize("path,name,sizes", CASES, ids=[c[1] for c in CASES])
def test_torch_eager_baseline_computes_the_model(path, name, sizes):
    model = load_program(ROOT / "examples" / path).models[name].with_sizes(sizes)
    full = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, full, seed=11)
    ref = reference(model, inputs, full)  # before the run: a model may update an input in place
    text, run = eager_baseline(model, full)
    out = run({k: v.clone() for k, v in inputs.items()})
    torch.cuda.synchronize()
    first = model.outputs[0].name
    operand_dtypes = {t.name: t.dtype.name for t in model.inputs if t.dtype and not t.is_index}
    g = compare(out, ref[first], tolerance(model, operand_dtypes | {t.name: t.dtype.name for t in model.intermediates
                                                                     if t.dtype}))
    assert g.ok, f"{text}: relative error {g.rel_error:.2e} > {g.tol:.0e}"
    assert "torch eager" in text


WORDS = """
 100 EXTENT: #R
 520 EXTENT: #D
   1 EXTENT: #ONE
bf16 TENSOR: X ( #R #D )
bf16 TENSOR: W ( #ONE #D )
bf16 TENSOR: Z ( #R #D )
bf16 TENSOR: Y ( #R #D )
MODEL: M-RMSNORM-W ( x w -- y ) RMSNORM-W ;
MODEL: M-LAYERNORM ( x -- y ) LAYERNORM ;
MODEL: M-GELU-TANH ( x -- y ) GELU-TANH ;
MODEL: M-SILU ( x z -- y ) ADD SILU ;
MODEL: M-SOFTMAX-GELU ( x -- y ) GELU SOFTMAX ;
"""


@pytest.mark.parametrize("name", ["M-RMSNORM-W", "M-LAYERNORM", "M-GELU-TANH", "M-SILU", "M-SOFTMAX-GELU"])
def test_each_expert_call_computes_its_library_word(name):
    from habu.spec.parser import parse_text
    from habu.timing.baselines import torch_baseline

    model = parse_text(WORDS, "words.habu").models[name]
    full = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, full, seed=5)
    ref = reference(model, inputs, full)
    text, run = torch_baseline(model, inputs)
    assert " as " in text, f"{name}: no expert call taken ({text})"
    out = run(inputs)
    torch.cuda.synchronize()
    tol = tolerance(model, {t.name: t.dtype.name for t in (*model.inputs, *model.intermediates) if t.dtype})
    g = compare(out, ref[model.outputs[0].name], tol)
    assert g.ok, f"{text}: relative error {g.rel_error:.2e} > {g.tol:.0e}"


def test_the_gathered_gemm_baseline_writes_f32_through_cublas():
    from habu.timing.baselines import torch_baseline

    model = load_program(ROOT / "examples" / "ggemm.habu").models["GGEMM"].with_sizes({"M": 256, "N": 384, "K": 520})
    full = {e.name: e.size for e in model.extents}
    inputs = make_inputs(model, full, seed=3)
    ref = reference(model, inputs, full)
    text, run = torch_baseline(model, inputs)
    assert text == "torch mm(A[IX], B.T, out_dtype=float32)"
    out = run(inputs)
    assert out.dtype == torch.float32
    g = compare(out, ref["O"], tolerance(model, {"A": "bf16", "B": "bf16", "O": "f32"}))
    assert g.ok and g.rel_error < 1e-5, g.rel_error  # f32 output: no rounding to bf16 on the way
