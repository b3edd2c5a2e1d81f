"""A Habu model with its derived backward as a `torch.autograd.Function` (`habu.build(..., grad=True)`).

    ffn = habu.build("examples/ffn_skip.habu", grad=True, B=16)
    y = ffn(x, w1, b1, w2, b2)          # the model's inputs in its order (`ffn.inputs`); y.backward() works

The forward runs the model with its saved values as extra outputs (`Backward.forward`: RMSNorm's
per-row rstd, a LINEAR's product, ... as `save` says) and keeps them for the backward, which runs the
derived backward model (`habu.spec.grad`) on the inputs, the saved values and the output gradients.
On CUDA both are proven, compiled Habu kernels; on the CPU both are the float64 reference (slow: for
tests, e.g. `torch.autograd.gradcheck` on small shapes). Gradients come back in the inputs' dtypes;
index tensors get none. torch is imported only when a function is built or called.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from habu.spec.grad import Backward
from habu.spec.ir import Model


@dataclass
class GradModel:
    """Callable with the forward model's inputs (positionally, in `inputs` order, or by name); returns
    its output, or a tuple of its outputs, differentiable by every input in `backward.gradients`."""

    model: Model
    backward: Backward
    forward_kernels: Any = None  # CompiledModel of backward.forward (CUDA), None: the float64 reference only
    backward_kernels: Any = None

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.model.inputs)

    def __call__(self, *tensors: Any, **by_name: Any) -> Any:
        if by_name:
            tensors = tuple(by_name[n] for n in self.inputs)
        outs = _function().apply(self, *tensors)
        return outs[0] if len(self.model.outputs) == 1 else outs

    # -- the two passes, on torch tensors
    def on_kernels(self, tensors: tuple) -> bool:
        return self.forward_kernels is not None and tensors[0].is_cuda

    def run_forward(self, tensors: tuple) -> dict[str, Any]:
        named = dict(zip(self.inputs, tensors, strict=True))
        if self.on_kernels(tensors):
            return _as_dict(self.forward_kernels(**{k: v.contiguous() for k, v in named.items()}), self.backward.forward)
        return _reference(self.backward.forward, named, tensors[0])

    def run_backward(self, named: dict[str, Any], like: Any) -> dict[str, Any]:
        if self.backward_kernels is not None and like.is_cuda:
            return _as_dict(self.backward_kernels(**{k: v.contiguous() for k, v in named.items()}), self.backward.model)
        return _reference(self.backward.model, named, like)


def _as_dict(result: Any, model: Model) -> dict[str, Any]:
    return result if isinstance(result, dict) else {model.outputs[0].name: result}


def _reference(model: Model, named: dict[str, Any], like: Any) -> dict[str, Any]:
    import torch

    from habu.spec.reference import evaluate

    host = {t.name: (named[t.name].detach().cpu().double().numpy() if named[t.name].is_floating_point()
                     else named[t.name].detach().cpu().numpy()) for t in model.inputs}
    return {k: torch.tensor(v, dtype=torch.float64, device=like.device) for k, v in evaluate(model, host).items()}


_FUNCTION: list[Any] = []


def _function() -> Any:
    """The torch.autograd.Function class (made once, when torch is first needed)."""
    if _FUNCTION:
        return _FUNCTION[0]
    import torch

    class HabuGradFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, gm: GradModel, *tensors: Any) -> Any:  # type: ignore[override]
            out = gm.run_forward(tensors)
            bw = gm.backward
            saved = [out[s] for _, s in bw.saved]
            ctx.gm = gm
            ctx.save_for_backward(*tensors, *saved)
            like = next(v for d, v in zip(gm.model.inputs, tensors, strict=True) if not d.is_index)
            # the kernels' outputs keep their declared dtypes; the float64 reference's take the inputs'
            results = [out[o.name] if gm.on_kernels(tensors) else out[o.name].to(like.dtype)
                       for o in gm.model.outputs]
            ctx.output_shapes = [r.shape for r in results]
            for t, d in zip(tensors, gm.model.inputs, strict=True):
                if d.is_index:
                    ctx.mark_non_differentiable(t)
            return tuple(results)

        @staticmethod
        def backward(ctx, *grads: Any) -> Any:  # type: ignore[override]
            gm: GradModel = ctx.gm
            bw = gm.backward
            stored = ctx.saved_tensors
            n = len(gm.inputs)
            inputs, saved = stored[:n], stored[n:]
            named: dict[str, Any] = dict(zip(gm.inputs, inputs, strict=True))
            named |= {s: v for (_, s), v in zip(bw.saved, saved, strict=True)}
            cot = dict(bw.cotangents)
            for o, g, shape in zip(gm.model.outputs, grads, ctx.output_shapes, strict=True):
                named[cot[o.name]] = g if g is not None else inputs[0].new_zeros(shape)
            for name in bw.accumulated:  # scatter targets: the gradient starts at zero
                source = next(x for x, gname in bw.gradients if gname == name)
                named[name] = torch.zeros_like(named[source], dtype=torch.float32)
            needed = {t.name for t in bw.model.inputs}
            out = gm.run_backward({k: v for k, v in named.items() if k in needed}, inputs[0])
            by_input = dict(bw.gradients)
            result: list[Any] = [None]
            for name, x in zip(gm.inputs, inputs, strict=True):
                g = out.get(by_input[name]) if name in by_input else None
                result.append(g.to(x.dtype) if g is not None else None)
            return tuple(result)

    _FUNCTION.append(HabuGradFunction)
    return HabuGradFunction


def build_grad(path: str | Path, model: str | None = None, *, target: str | None = None, trials: int = 3,
               wrt: list[str] | None = None, save: str = "auto", kernels: bool = True,
               backward_pins: dict[str, str] | None = None, **shape: int) -> GradModel:
    """The model of `path` and its derived backward; with `kernels` (and a GPU target) both compiled
    from proven plans, else the float64 reference on the CPU only. `backward_pins` pin the backward's plan
    (e.g. {"storage": "bf16"}: its cotangents stored in bf16, habu/plan/storage_pin.py)."""
    from habu.spec.grad_program import derive_model
    from habu.spec.grad_save import SaveMode, SavePolicy
    from habu.spec.parser import load_program

    program = load_program(path)
    m = program.pick(model)
    bw = derive_model(program, m.name, wrt, SavePolicy(SaveMode(save)))
    gm = GradModel(_sized(m, shape), replace(bw, forward=_sized(bw.forward, shape), model=_sized(bw.model, shape)))
    if kernels:
        from habu.compile import compile_model
        from habu.emit_cuda.guards import KernelSet
        from habu.emit_cuda.runtime import CompiledModel
        from habu.gpu_info import current_arch
        from habu.paths.emit import emit
        from habu.target import target_named

        tgt = target_named(target or current_arch())
        built = []
        for derived in (bw.forward, bw.model):
            name = f"{derived.name}-{'FWD' if derived is bw.forward else 'BWD'}"
            program.models[name] = derived
            program.model_spans[name] = program.model_spans[m.name]
            pins = dict(backward_pins or {}) if derived is bw.model else {}
            compiled = compile_model(program, name, dict(shape), tgt, pins, trials)
            members = [(proof.plan.guards, emit(proof, tgt)) for proof in compiled.proofs]
            built.append(CompiledModel(compiled.model, KernelSet(members), arch=tgt.name))
        gm.forward_kernels, gm.backward_kernels = built
    return gm


def _sized(model: Model, shape: dict[str, int]) -> Model:
    return model.with_sizes({k: v for k, v in shape.items() if any(e.name == k for e in model.extents)})
