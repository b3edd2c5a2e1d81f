"""A differentiable Habu model as torch custom ops, so `torch.compile(fullgraph=True)` traces through its
forward and backward without a graph break.

    gm = habu.build("examples/ffn_skip.habu", grad=True, B=16)
    ffn = habu.torch_grad_ops.as_autograd_op(gm)      # torch.ops.habu_grad.ffn_skip_fwd / _bwd
    step = torch.compile(lambda *a: ffn(*a).square().sum(), fullgraph=True)

Two ops: `<name>_fwd` (the model's inputs -> its outputs and the values the backward reads, as
`Backward.forward` computes them) and `<name>_bwd` (the inputs, those values and the output gradients
-> the gradients), joined by `torch.library.register_autograd`. Each runs the proven kernels on CUDA
and the float64 reference on the CPU, as `habu.torch_grad.GradModel` does; their fake implementations
give the shapes from the model's extents (`habu.torch_ops.output_shapes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from habu.torch_grad import GradModel
from habu.torch_ops import output_shapes, sanitise

NAMESPACE = "habu_grad"
_ops: dict[str, Callable[..., Any]] = {}


def as_autograd_op(gm: GradModel, name: str | None = None) -> Callable[..., Any]:
    """The model of `gm` as a differentiable function of its inputs (positionally, in `gm.inputs` order)
    built from two registered custom ops; made once per name."""
    import torch

    base = name or sanitise(gm.model.name)
    if base in _ops:
        return _ops[base]
    bw = gm.backward
    model = gm.model
    outs = [o.name for o in model.outputs]
    extra = [s for _, s in bw.saved if s not in outs]  # the forward's added outputs (its saved intermediates)
    saved = extra + [s for _, s in bw.saved if s in outs]  # and the outputs the backward reads (grad_reuse)
    wrt = [x for x, _ in bw.gradients]
    cot = dict(bw.cotangents)
    ins = [sanitise(t) for t in gm.inputs]
    fwd_schema = "(" + ", ".join(f"Tensor {n}" for n in ins) + ") -> " + _returns(len(outs) + len(extra))
    bwd_args = [*ins, *(f"s_{sanitise(s)}" for s in saved), *(f"g_{sanitise(o)}" for o in outs)]
    bwd_schema = "(" + ", ".join(f"Tensor {n}" for n in bwd_args) + ") -> " + _returns(len(wrt))
    floating = [k for k, t in enumerate(model.inputs) if not t.is_index]

    def fwd(*tensors: Any) -> tuple:
        out = gm.run_forward(tensors)
        like = tensors[floating[0]]
        keep = gm.on_kernels(tensors)
        return _one(tuple(out[n] if keep else out[n].to(like.dtype) for n in [*outs, *extra]))

    def fwd_fake(*tensors: Any) -> tuple:
        shapes = output_shapes(bw.forward, [tuple(t.shape) for t in tensors])
        like = tensors[floating[0]]
        return _one(tuple(like.new_empty(s) for s in shapes))

    def bwd(*args: Any) -> tuple:
        n = len(ins)
        named = dict(zip(gm.inputs, args[:n], strict=True))
        named |= dict(zip(saved, args[n:n + len(saved)], strict=True))
        named |= {cot[o]: g for o, g in zip(outs, args[n + len(saved):], strict=True)}
        for acc in bw.accumulated:
            source = next(x for x, g in bw.gradients if g == acc)
            named[acc] = torch.zeros_like(named[source], dtype=torch.float32)
        needed = {t.name for t in bw.model.inputs}
        out = gm.run_backward({k: v for k, v in named.items() if k in needed}, args[floating[0]])
        grads = dict(bw.gradients)
        return _one(tuple(out[grads[x]].to(named[x].dtype) for x in wrt))

    def bwd_fake(*args: Any) -> tuple:
        return _one(tuple(torch.empty_like(args[gm.inputs.index(x)]) for x in wrt))

    fwd_op = torch.library.custom_op(f"{NAMESPACE}::{base}_fwd", fwd, mutates_args=(), schema=fwd_schema)
    fwd_op.register_fake(fwd_fake)
    bwd_op = torch.library.custom_op(f"{NAMESPACE}::{base}_bwd", bwd, mutates_args=(), schema=bwd_schema)
    bwd_op.register_fake(bwd_fake)

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        output = _many(output)
        ctx.save_for_backward(*inputs, *output[len(outs):], *(output[outs.index(s)] for s in saved[len(extra):]))
        ctx.shapes = [o.shape for o in output[:len(outs)]]

    def backward(ctx: Any, *grads: Any) -> tuple:
        stored = ctx.saved_tensors
        inputs = stored[:len(ins)]
        cotangents = [g if g is not None else inputs[floating[0]].new_zeros(s)
                      for g, s in zip(grads[:len(outs)], ctx.shapes, strict=True)]
        got = dict(zip(wrt, _many(bwd_op(*stored, *cotangents)), strict=True))
        return tuple(got.get(x) for x in gm.inputs)

    fwd_op.register_autograd(backward, setup_context=setup_context)

    def call(*tensors: Any) -> Any:
        result = _many(fwd_op(*tensors))
        return result[0] if len(outs) == 1 else tuple(result[:len(outs)])

    _ops[base] = call
    return call


def _returns(n: int) -> str:
    return "Tensor" if n == 1 else "(" + ", ".join(["Tensor"] * n) + ")"


def _one(values: tuple) -> Any:
    """A one-tensor result as the tensor (a schema returning one Tensor), several as the tuple."""
    return values[0] if len(values) == 1 else values


def _many(result: Any) -> tuple:
    return result if isinstance(result, tuple | list) else (result,)
