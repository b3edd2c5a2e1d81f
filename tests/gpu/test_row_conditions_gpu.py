"""Row kernels that compute conditions on indices (session 64, habu/lower/rows.py `conditions_on_columns`), on the
GPU: tests/data/masked_rows.habu's causal row maximum, masked row sum and masked softmax against the float64
reference at its sizes, at ragged ones, and with rows that see no column (their sum 0, their weights 0), NaN-poisoned
outputs. Attention's forward that saves its statistics (one row kernel for R1, R2 and P) runs in
test_torch_grad_gpu.py's attention case, against the reference."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.plan.plan import RowKernel  # noqa: E402
from habu.timing.harness import compare, make_inputs, plan_tolerance, poisoned_outputs, reference  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

DATA = str(ROOT / "tests" / "data" / "masked_rows.habu")


CASES = [(name, sizes, shape) for name in ("MASKED-MAX", "MASKED-SUM", "MASKED-SOFTMAX")
         for shape, sizes in (("declared", {}), ("ragged", {"I": 37, "J": 53, "N": 54}))]
# rows with no visible column (j ≤ i − 16 for i < 16): the sum 0, the weights 0, the maximum −∞ (the golden check
# takes a matching infinity as equal: habu/timing/harness.py `relative_error`)
CASES += [(name, {"I": 37, "J": 21, "N": 22}, "masked-rows") for name in ("MASKED-MAX", "MASKED-SUM", "MASKED-SOFTMAX")]


@pytest.mark.parametrize("name,sizes", [pytest.param(n, s, id=f"{n}-{i}") for n, s, i in CASES])
def test_a_masked_row_kernel_matches_the_float64_reference(name, sizes):
    built = build(DATA, name, sizes)
    assert any(isinstance(k, RowKernel) for k in built.plan.kernels), built.plan.kernels
    inputs = make_inputs(built.model, built.sizes, seed=11)
    outs = poisoned_outputs(built.model, built.sizes)
    built.compiled(**inputs, **outs)
    torch.cuda.synchronize()
    want = reference(built.model, inputs, built.sizes)
    for out in built.model.outputs:
        got = compare(outs[out.name], want[out.name], plan_tolerance(built.model, built.plan))
        assert got.unwritten == 0 and got.ok, (out.name, got)
