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


@pytest.mark.parametrize("sizes, kept", [({"B": 128, "D": 1024, "H": 2048}, {"keep_operands": "true"}),
                                         ({"B": 200, "D": 1024, "H": 2048}, {"keep_operands": "true"}),
                                         ({"B": 128, "D": 4096, "H": 14336}, {})],
                         ids=["128-pinned", "200-pinned", "128-default"])
def test_keeping_the_operands_in_the_l2_changes_no_output_bit(sizes, kept):
    compiled, keep = _built(True, sizes, kept)
    assert any(getattr(k, "keep_operands", False) for k in compiled.plans[0].kernels)
    assert any("l2_policy_evict_last()" in k.source for k in keep.kernel_set.members[0][1].kernels)
    _, plain = _built(True, sizes, {"keep_operands": "false"})
    assert_same_outputs(compiled.model.with_sizes(sizes), keep, plain, seed=sizes["B"])


@pytest.mark.parametrize("sizes, streamed", [({"B": 128, "D": 1024, "H": 2048}, {"stream_b": "true"}),
                                             ({"B": 200, "D": 1024, "H": 2048}, {"stream_b": "true"}),
                                             ({"B": 128, "D": 4096, "H": 14336}, {})],
                         ids=["128-pinned", "200-pinned", "128-default"])
def test_streaming_the_weights_past_the_l2_changes_no_output_bit(sizes, streamed):
    compiled, hinted = _built(True, sizes, streamed)
    assert any(getattr(k, "stream_b", False) for k in compiled.plans[0].kernels)
    assert any("l2_policy_evict_first()" in k.source for k in hinted.kernel_set.members[0][1].kernels)
    _, plain = _built(True, sizes, {"stream_b": "false"})
    assert_same_outputs(compiled.model.with_sizes(sizes), hinted, plain, seed=sizes["B"] + 1)
