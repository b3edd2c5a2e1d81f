"""`habu.build(..., grad=True)`: the model and its derived backward inside torch.autograd (CPU: the float64
reference; gradcheck on small shapes)."""

from __future__ import annotations

import pytest

from habu.torch_grad import build_grad
from tests.conftest import ROOT

torch = pytest.importorskip("torch")
EX = ROOT / "examples"


def _inputs(gm, sizes, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in gm.model.inputs:
        shape = tuple(sizes[e] for e in t.extents)
        if t.is_index:
            out.append(torch.randint(0, sizes[t.range], shape, generator=g))
        else:
            x = (torch.rand(shape, generator=g, dtype=torch.float64) + 0.5) * (2 * torch.randint(0, 2, shape, generator=g) - 1)
            out.append(x.requires_grad_())
    return out


@pytest.mark.parametrize("stem,model,sizes", [
    ("ffn_skip", "FFN-SKIP", {"B": 3, "ONE": 1, "D": 4, "H": 5}),
    ("softmax", "SOFTMAX-ROWS", {"R": 3, "C": 4}),
    ("rmsnorm", "RMSNORM-ROWS", {"R": 3, "D": 4}),
    ("ggemm", "GGEMM", {"M": 4, "N": 3, "K": 5}),
    ("scatter_add", "UNPERMUTE", {"R": 5, "T": 3, "N": 2}),
])
def test_gradcheck_through_the_derived_backward(stem, model, sizes):
    gm = build_grad(EX / f"{stem}.habu", model, kernels=False, **sizes)
    xs = _inputs(gm, sizes)
    assert torch.autograd.gradcheck(lambda *a: gm(*a), tuple(xs), eps=1e-6, atol=1e-6)


def test_grads_match_torch_autograd_of_the_same_block():
    sizes = {"B": 3, "ONE": 1, "D": 4, "H": 5}
    gm = build_grad(EX / "ffn_skip.habu", kernels=False, **sizes)
    x, w1, b1, w2, b2 = _inputs(gm, sizes, seed=1)
    y = gm(x, w1, b1, w2, b2)
    (y * y).sum().backward()
    ours = [t.grad.clone() for t in (x, w1, b1, w2, b2)]
    for t in (x, w1, b1, w2, b2):
        t.grad = None
    h = torch.nn.functional.gelu(x @ w1 + b1) @ w2 + b2 + x
    ref = h * torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6)
    (ref * ref).sum().backward()
    torch.testing.assert_close(y, ref)
    for mine, t in zip(ours, (x, w1, b1, w2, b2), strict=True):
        torch.testing.assert_close(mine, t.grad)


def test_the_custom_ops_trace_under_torch_compile_fullgraph_and_differentiate():
    from habu.torch_grad_ops import as_autograd_op

    sizes = {"R": 3, "D": 4}
    gm = build_grad(EX / "rmsnorm.habu", "RMSNORM-ROWS", kernels=False, **sizes)
    norm = as_autograd_op(gm, "rmsnorm_rows_test")
    assert as_autograd_op(gm, "rmsnorm_rows_test") is norm
    (x,) = _inputs(gm, sizes, seed=2)
    assert torch.autograd.gradcheck(norm, (x,), eps=1e-6, atol=1e-6)
    step = torch.compile(lambda a: (norm(a) * norm(a)).sum(), fullgraph=True, backend="aot_eager")
    step(x).backward()
    ref = x.detach().clone().requires_grad_()
    y = ref * torch.rsqrt((ref * ref).mean(-1, keepdim=True) + 1e-6)
    (y * y).sum().backward()
    torch.testing.assert_close(x.grad, ref.grad)


def test_the_custom_ops_differentiate_a_gathered_gemm_by_scatter_add():
    from habu.torch_grad_ops import as_autograd_op

    sizes = {"M": 4, "N": 3, "K": 5}
    gm = build_grad(EX / "ggemm.habu", kernels=False, **sizes)
    ggemm = as_autograd_op(gm, "ggemm_test")
    a, ix, b = _inputs(gm, sizes, seed=3)
    ix = torch.tensor([2, 2, 0, 3])  # a repeated row: its gradients accumulate
    assert torch.autograd.gradcheck(ggemm, (a, ix, b), eps=1e-6, atol=1e-6)


ATTENTION = {"B": 1, "G": 2, "R": 2, "I": 3, "J": 4, "E": 2, "D": 3}


def test_gradcheck_through_attentions_backward_that_reads_its_output():
    """Attention's backward reads the forward's output O (habu/spec/grad_reuse.py: D = Σ d dO·O): the autograd
    Function saves it with the statistics, and the gradients pass gradcheck."""
    gm = build_grad(EX / "attention.habu", "ATTENTION-GQA", kernels=False, **ATTENTION)
    assert ("O", "O") in gm.backward.saved
    xs = _inputs(gm, ATTENTION, seed=4)
    assert torch.autograd.gradcheck(lambda *a: gm(*a), tuple(xs), eps=1e-6, atol=1e-6)


def test_the_custom_ops_save_an_output_the_backward_reads_once():
    """The forward op returns O once (a custom op's outputs may not alias), and the backward op gets it from the
    saved outputs; gradcheck and torch.compile(fullgraph=True) through both."""
    from habu.torch_grad_ops import as_autograd_op

    gm = build_grad(EX / "attention.habu", "ATTENTION-GQA", kernels=False, **ATTENTION)
    attention = as_autograd_op(gm, "attention_gqa_test")
    xs = _inputs(gm, ATTENTION, seed=5)
    assert torch.autograd.gradcheck(attention, tuple(xs), eps=1e-6, atol=1e-6)
    step = torch.compile(lambda *a: attention(*a).square().sum(), fullgraph=True, backend="aot_eager")
    step(*xs).backward()
    got = [x.grad.clone() for x in xs]
    for x in xs:
        x.grad = None
    gm(*xs).square().sum().backward()
    for mine, x in zip(got, xs, strict=True):
        torch.testing.assert_close(mine, x.grad)
