"""`keep_operands` and `stream_b` on the GPU (the operands' TMA loads with L2 eviction policies,
habu/paths/l2_keep.py): FFN-SKIP's derived backward with each hint and without, on NaN-poisoned outputs: the
outputs are bit for bit the same (a hint changes no value), at ragged sizes under the pin and at the 128-token
layer where the default takes it."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from tests.gpu.test_warm_next_gpu import _built, assert_same_outputs  # noqa: E402

SIZES = {"128-pinned": {"B": 128, "D": 1024, "H": 2048}, "200-pinned": {"B": 200, "D": 1024, "H": 2048},
         "128-default": {"B": 128, "D": 4096, "H": 14336}}  # the pin at ragged sizes; the layer the default hints


@pytest.mark.parametrize("case", list(SIZES))
@pytest.mark.parametrize("field, policy", [("keep_operands", "l2_policy_evict_last()"),
                                           ("stream_b", "l2_policy_evict_first()")])
def test_an_l2_hint_changes_no_output_bit(field, policy, case):
    sizes = SIZES[case]
    compiled, hinted = _built(True, sizes, {} if case.endswith("default") else {field: "true"})
    assert any(getattr(k, field, False) for k in compiled.plans[0].kernels)
    assert any(policy in k.source for k in hinted.kernel_set.members[0][1].kernels)
    _, plain = _built(True, sizes, {field: "false"})
    assert_same_outputs(compiled.model.with_sizes(sizes), hinted, plain, seed=sizes["B"] + len(field))
