"""The fused attention kernel storing a training forward's row statistics (`fused:T`, habu/plan/attention_fused.py;
run through the device tool): R1 (each row's softmax maximum), R2 (its sum) and O against the float64 reference of
the derived forward, on the wgmma loop (the default from 128 queries) and the mma.sync loop (pinned), causal GQA
with fully masked rows (more queries than keys: R1 = −∞, R2 = 0, O = 0) and full attention at head width 64."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.timing.harness import (  # noqa: E402
    compare,
    make_inputs,
    plan_tolerance,
    poisoned_outputs,
    reference,
    tolerance,
)
from tests.gpu.test_forward_saved_gpu import derived_forward  # noqa: E402

GQA = ("examples/attention.habu", "ATTENTION-GQA")
FULL = ("tests/data/full_attention.habu", "FULL-ATTENTION")


@pytest.mark.parametrize("source, static, pins, loop", [
    (GQA, {"B": 1, "G": 2, "R": 2, "I": 300, "J": 300}, None, "wgmma"),
    (GQA, {"B": 2, "G": 2, "R": 2, "I": 1000, "J": 1000}, None, "wgmma"),
    (GQA, {"B": 1, "G": 2, "R": 2, "I": 300, "J": 200}, None, "wgmma"),  # rows 0..99 see no key
    (FULL, {"I": 200, "J": 136}, None, "wgmma"),
    (GQA, {"B": 1, "G": 2, "R": 2, "I": 72, "J": 40}, {"family": "attention"}, "mma.sync"),
    (FULL, {"I": 40, "J": 40}, {"family": "attention"}, "mma.sync"),
], ids=["gqa-300", "gqa-1000", "gqa-masked-rows", "full-d64", "gqa-mma-sync", "full-mma-sync"])
def test_the_fused_forward_stores_the_statistics_the_backward_reads(source, static, pins, loop):
    compiled, fwd = derived_forward(*source, {}, static, pins)
    [kernel] = compiled.plans[0].kernels
    assert (kernel.kind, kernel.nodes, kernel.main_loop) == ("attention", ("R1", "R2", "O"), loop)
    model = compiled.model
    sizes = {e.name: e.size for e in model.extents if e.size is not None}
    for seed in (1, 2):  # fresh inputs each time, outputs poisoned
        inputs = make_inputs(model, sizes, seed=seed)
        got = fwd(**inputs, **poisoned_outputs(model, sizes))
        torch.cuda.synchronize()
        want = reference(model, inputs, sizes)
        # R1 and R2 are f32 values of f32 arithmetic (tolerance's 1e-4); O's P is rounded to bf16 inside the kernel
        # (`internal_stage`: plan_tolerance's 2e-2; session 65's H100 run: O 1.1e-3 to 1.4e-3 from the reference)
        plan = compiled.plans[0]
        for name in ("R1", "R2", "O"):
            tol = plan_tolerance(model, plan) if name == "O" else tolerance(model, dict(plan.storage))
            g = compare(got[name], want[name], tol)
            assert g.unwritten == 0 and g.ok, (name, static, g)
    if source == GQA and static["J"] < static["I"]:  # causal: the first #I − #J rows see no key: −∞ and 0
        r1, r2 = got["R1"][..., :static["I"] - static["J"]], got["R2"][..., :static["I"] - static["J"]]
        assert bool(torch.all(r1 == float("-inf"))) and bool(torch.all(r2 == 0)), \
            (loop, static, int((r1 != float("-inf")).sum()), int((r2 != 0).sum()), r1.flatten()[:4], r2.flatten()[:4])


def test_regression_the_unfused_forwards_maximum_of_a_row_with_no_visible_key_is_minus_infinity():
    """The unfused training forward (pinned: its row kernel's maximum reads the masked scores, a tensor, with no
    condition of its own) stored −FLT_MAX as R1 of a row that sees no key until session 65; the model's is −∞."""
    static = {"B": 1, "G": 2, "R": 2, "I": 72, "J": 40}  # rows 0..31 see no key
    compiled, fwd = derived_forward(*GQA, {}, static, {"rewrite": "split:%f2"})
    assert [k.kind for k in compiled.plans[0].kernels] == ["contraction", "rows", "contraction"]
    model = compiled.model
    sizes = {e.name: e.size for e in model.extents if e.size is not None}
    inputs = make_inputs(model, sizes, seed=3)
    got = fwd(**inputs, **poisoned_outputs(model, sizes))
    torch.cuda.synchronize()
    want = reference(model, inputs, sizes)
    for name in ("R1", "R2", "O"):
        g = compare(got[name], want[name], plan_tolerance(model, compiled.plans[0]))
        assert g.unwritten == 0 and g.ok, (name, g)
    assert bool(torch.all(got["R1"][..., :32] == float("-inf")))
