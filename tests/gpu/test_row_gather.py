"""Row kernels over rows read through an index tensor on the GPU (tests/data/row_gather.habu): against the
float64 reference at the file's width and at Mixtral's (#D 4096), every element written, and an index out of
its range masked (the row reads zeros) and reported by check_errors."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.timing.harness import compare, make_inputs, plan_tolerance, poisoned_outputs, reference  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

DATA = str(ROOT / "tests" / "data" / "row_gather.habu")


@pytest.mark.parametrize("name", ["ROW-DOT", "GATHERED-RMSNORM"])
@pytest.mark.parametrize("sizes,pins", [({}, {}), ({"D": 4096, "R": 1000}, {}),
                                        ({"D": 4096, "R": 1000}, {"row_prefetch": "true"}),
                                        ({"D": 4096, "R": 1000}, {"row_cluster": "2", "threads": "256"})],
                         ids=["small", "d4096", "d4096-prefetch", "d4096-cluster"])
def test_a_gathered_row_kernel_matches_the_float64_reference(name, sizes, pins):
    built = build(DATA, name, sizes, pins)
    assert [k.kind for k in built.plan.kernels] == ["rows"]
    inputs = make_inputs(built.model, built.sizes, 11, "random")
    got = built.compiled(**inputs, **poisoned_outputs(built.model, built.sizes))
    torch.cuda.synchronize()
    want = reference(built.model, inputs, built.sizes)
    out = built.model.outputs[0].name
    g = compare(got if not isinstance(got, dict) else got[out], want[out], plan_tolerance(built.model, built.plan))
    assert g.unwritten == 0 and g.ok, g


def test_a_gathered_row_index_out_of_range_is_masked_and_reported():
    from habu.emit_cuda.device_errors import IndexValueError, check_errors

    built = build(DATA, "ROW-DOT", {})
    inputs = make_inputs(built.model, built.sizes, 5, "random")
    tokens = built.sizes["T"]
    inputs["IX"][3] = tokens
    got = built.compiled(**inputs, **poisoned_outputs(built.model, built.sizes))
    with pytest.raises(IndexValueError, match=rf"IX: values must be in 0\.\.{tokens - 1}.*found {tokens} at IX\[3\]"):
        check_errors()
    z = got if not isinstance(got, dict) else got["Z"]
    assert float(z[3]) == 0.0  # the row's reads are masked: its sum is of zeros
    ix = inputs["IX"].long().clamp(max=tokens - 1)
    want = (inputs["A"].double()[ix] * inputs["B"].double()).sum(1)
    ok = torch.arange(len(ix), device=ix.device) != 3
    assert torch.allclose(z.double()[ok], want[ok], rtol=1e-4, atol=1e-3)
