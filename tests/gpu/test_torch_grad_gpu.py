"""`habu.build(..., grad=True)` on a GPU: the forward (with its saved values) and the derived backward
run as proven Habu kernels; their gradients against the float64 reference of the same derivation."""

from __future__ import annotations

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


@pytest.mark.parametrize("stem,model,sizes", [("ffn_skip", "FFN-SKIP", {"B": 64, "D": 128, "H": 256}),
                                        ("rmsnorm", "RMSNORM-ROWS", {"R": 64, "D": 256}),
                                        ("softmax", "SOFTMAX-ROWS", {"R": 64, "C": 256}),
                                        # its backward reads the forward's output O (habu/spec/grad_reuse.py)
                                        ("attention", "ATTENTION-GQA", {"B": 1, "G": 2, "R": 2, "I": 40, "J": 72})])
def test_habu_kernels_forward_and_backward_match_the_reference(stem, model, sizes):
    import habu
    from habu.torch_grad import build_grad

    path = ROOT / "examples" / f"{stem}.habu"
    gm = habu.build(path, model, grad=True, **sizes)
    ref = build_grad(path, model, kernels=False, **sizes)
    g = torch.Generator(device="cuda").manual_seed(0)
    xs = []
    for t in gm.model.inputs:
        full = {**sizes, **{e.name: e.size for e in gm.model.extents if e.size is not None}}
        shape = tuple(full[e] for e in t.extents)
        xs.append(torch.randn(shape, generator=g, device="cuda").to(torch.bfloat16).requires_grad_())
    y = gm(*xs)
    dy = torch.randn(y.shape, generator=g, device="cuda").to(y.dtype)
    y.backward(dy)
    cpu = [x.detach().cpu().double().requires_grad_() for x in xs]
    y_ref = ref(*cpu)
    y_ref.backward(dy.cpu().double())
    torch.testing.assert_close(y.float().cpu().double(), y_ref.detach(), rtol=2e-2, atol=2e-2)
    for x, c in zip(xs, cpu, strict=True):
        torch.testing.assert_close(x.grad.float().cpu().double(), c.grad, rtol=5e-2, atol=5e-2)
