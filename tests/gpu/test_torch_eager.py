"""Models run as torch eager ops: the output against the float64 reference, on fresh random inputs,
for each example model that is not one contraction, at a small, ragged shape."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.harness import compare, make_inputs, reference, tolerance  # noqa: E402
from habu.bench.torch_eager import eager_baseline  # noqa: E402
from habu.spec.parser import load_program  # noqa: E402
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
