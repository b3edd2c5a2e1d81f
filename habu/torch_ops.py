"""A built Habu model as a torch custom op, so `torch.compile(fullgraph=True)` traces through it.

    ggemm = habu.build("examples/ggemm.habu", K=511)
    op = habu.torch_ops.as_op(ggemm)             # registers torch.ops.habu.ggemm
    o = op(a, ix, b)                              # positionally in op.inputs order: ("A", "IX", "B")
    o = op(A=a, B=b, IX=ix)                       # or by the model's tensor names

The op takes the model's input tensors positionally, in the model's input order `op.inputs` (for a
composition, its signature `( x w1 b1 w2 b2 -- y )`; for an equation, the order it first reads them:
GGEMM's is A, IX, B), or by the model's tensor names (`op(A=a, B=b, IX=ix)`). It returns the output
tensor, or a tuple of them in the model's output order (`op.outputs`) when it has several.

- CUDA: the `CompiledModel`, on torch's current stream of the inputs' device (the runtime launches
  there when its arrays are torch tensors; outputs are allocated by torch's caching allocator on that
  stream). Inputs are made contiguous first; every other precondition is the runtime's (shapes within
  the extents, dtypes and alignment, checked before a launch; index values are checked inside the
  kernels and reported by `habu.check_errors()`). Index tensors may be int64: the runtime narrows them
  on the device. Nothing on the call path copies from the device or synchronises, so the op can be
  captured in a CUDA graph (`torch.cuda.graph`, `mode="reduce-overhead"`) once it has run eagerly
  with inputs of the same shapes.
- CPU: the model's float64 reference (`habu.spec.reference.evaluate`), rounded to the output dtype.
  It is a slow reference, there for tests and for tracing on machines without a GPU; it runs no
  Habu kernel.
- Fake (meta) tensors: the output shapes from the model's extents — a static extent's declared size,
  a runtime extent's size from the first input that has it (a symbolic size stays symbolic, so
  `torch.compile(dynamic=True)` traces one graph for every size) — and the declared dtypes.

The ops have no autograd formula: use them under `torch.no_grad()` / `torch.inference_mode()`
(`habu.nn`'s layers do register one). torch is imported here, so import this module only where
torch is installed; the rest of Habu never imports it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from habu.emit_cuda.arrays import TORCH_DTYPES, ArgumentError
from habu.emit_cuda.runtime import CompiledModel
from habu.errors import UsageError
from habu.spec.ir import Model, TensorDecl

NAMESPACE = "habu"
_HABU_TO_TORCH = {habu: name for name, habu in TORCH_DTYPES.items()}
_INDEX_TORCH_TYPES = ("int16", "int32", "int64")
_registered: dict[str, HabuOp] = {}  # qualified name -> op (one per CompiledModel)


def sanitise(name: str) -> str:
    """A model or tensor name as an identifier torch's schema parser takes (GGEMM -> ggemm,
    FFN-SKIP -> ffn_skip)."""
    out = re.sub(r"[^0-9a-zA-Z_]", "_", name).lower()
    return out if out and not out[0].isdigit() else f"m_{out}"


def _dtype_name(decl: TensorDecl) -> str:
    return decl.dtype.name if decl.dtype else "f32"


def unsized_outputs(model: Model) -> list[str]:
    """`Y's #N` for each runtime extent of an output that no input has (its size cannot be known)."""
    have = {e for d in model.inputs for e in d.extents} | {e.name for e in model.extents if e.is_static}
    return [f"{d.name}'s #{e}" for d in model.outputs for e in d.extents if e not in have]


def output_shapes(model: Model, input_shapes: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """The outputs' shapes for inputs of these shapes (ints or torch SymInts, in input order).

    Ranks, and every size that is a plain int, are checked against the model (ArgumentError);
    symbolic sizes are taken as they are (the kernel call checks the real ones)."""
    if len(input_shapes) != len(model.inputs):
        raise ArgumentError(f"{model.name} takes {len(model.inputs)} tensors "
                            f"({', '.join(d.name for d in model.inputs)}), got {len(input_shapes)}")
    sizes: dict[str, Any] = {e.name: e.size for e in model.extents if e.is_static}
    source: dict[str, str] = {}
    for decl, shape in zip(model.inputs, input_shapes, strict=True):
        if len(shape) != len(decl.extents):
            raise ArgumentError(f"{decl.name}: expected {len(decl.extents)} dimensions "
                                f"( {' '.join('#' + e for e in decl.extents)} ), got shape {tuple(shape)}")
        for e, n in zip(decl.extents, shape, strict=True):
            ext = model.extent(e)
            if e not in sizes:
                if isinstance(n, int) and not ext.admits(n):
                    raise ArgumentError(f"{decl.name}: size {n} along #{e} is outside its declared range "
                                        f"({ext.describe()})")
                sizes[e], source[e] = n, decl.name
            elif isinstance(n, int) and isinstance(sizes[e], int) and n != sizes[e]:
                was = f"#{e} = {sizes[e]} from {source[e]}" if e in source else ext.describe()
                raise ArgumentError(f"{decl.name}: size {n} along #{e}, but {was}")
    out = []
    for decl in model.outputs:
        missing = [e for e in decl.extents if e not in sizes]
        if missing:
            raise UsageError(f"{model.name}: the size of output {decl.name}'s "
                             f"{', '.join('#' + m for m in missing)} does not come from any input")
        out.append(tuple(sizes[e] for e in decl.extents))
    return out


def schema_of(model: Model) -> str:
    """`(Tensor a, Tensor b, Tensor ix) -> Tensor`, or `-> (Tensor, Tensor)` for several outputs."""
    names = [sanitise(d.name) for d in model.inputs]
    if len(set(names)) != len(names):
        names = [f"{n}_{i}" for i, n in enumerate(names)]
    ret = "Tensor" if len(model.outputs) == 1 else "(" + ", ".join("Tensor" for _ in model.outputs) + ")"
    return "(" + ", ".join(f"Tensor {n}" for n in names) + ") -> " + ret


class HabuOp:
    """A registered op: call it with the model's inputs, positionally (`inputs` gives their order)."""

    def __init__(self, compiled: CompiledModel, qualname: str):
        import torch

        self.compiled, self.model, self.qualname = compiled, compiled.model, qualname
        self.inputs = tuple(d.name for d in self.model.inputs)
        self.outputs = tuple(d.name for d in self.model.outputs)
        self._torch = torch
        self._out_dtypes = [getattr(torch, _HABU_TO_TORCH[_dtype_name(d)]) for d in self.model.outputs]
        self.op = torch.library.custom_op(qualname, self._run_cuda, mutates_args=(), device_types="cuda",
                                          schema=schema_of(self.model))
        self.op.register_kernel("cpu", self._run_reference)
        self.op.register_fake(self._fake)

    def __call__(self, *tensors: Any, **by_name: Any) -> Any:
        """`op(a, ix, b)` in `inputs` order, or by the model's tensor names: `op(A=a, B=b, IX=ix)`."""
        if by_name:
            unknown = [n for n in by_name if n not in self.inputs]
            if unknown or tensors:
                why = f"{', '.join(unknown)}: not an input" if unknown else "positional and named tensors mixed"
                raise ArgumentError(f"{self.qualname}: {why} (inputs: {', '.join(self.inputs)})")
            missing = [n for n in self.inputs if n not in by_name]
            if missing:
                raise ArgumentError(f"{self.qualname}: missing {', '.join(missing)} (inputs: {', '.join(self.inputs)})")
            tensors = tuple(by_name[n] for n in self.inputs)
        return self.op(*tensors)

    def __repr__(self) -> str:
        return f"HabuOp({self.qualname}: ({' '.join(self.inputs)} -- {' '.join(self.outputs)}))"

    # -- the three implementations
    def _results(self, outs: Sequence[Any]) -> Any:
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _check_dtypes(self, tensors: Sequence[Any]) -> None:
        for decl, t in zip(self.model.inputs, tensors, strict=True):
            got = str(t.dtype).removeprefix("torch.")
            want = _HABU_TO_TORCH[_dtype_name(decl)]
            if got != want and not (decl.is_index and got in _INDEX_TORCH_TYPES):
                also = " (or int16/int32/int64: an index tensor)" if decl.is_index else ""
                raise ArgumentError(f"{self.qualname}: {decl.name}: expected torch.{want}{also}, got {t.dtype}")

    def _fake(self, *tensors: Any) -> Any:
        self._check_dtypes(tensors)
        shapes = output_shapes(self.model, [tuple(t.shape) for t in tensors])
        device = tensors[0].device if tensors else None
        return self._results([self._torch.empty(s, dtype=dt, device=device)
                              for s, dt in zip(shapes, self._out_dtypes, strict=True)])

    def _run_cuda(self, *tensors: Any) -> Any:
        self._check_dtypes(tensors)
        args = {name: t.contiguous() for name, t in zip(self.inputs, tensors, strict=True)}
        result = self.compiled(**args)  # on torch.cuda.current_stream() of the tensors' device
        if len(self.outputs) == 1:
            return result
        return tuple(result[n] for n in self.outputs)

    def _run_reference(self, *tensors: Any) -> Any:
        """The float64 reference on the host (slow): what the CPU kernel of the op is."""
        from habu.spec.reference import evaluate

        self._check_dtypes(tensors)
        torch = self._torch
        host = {name: t.detach().double().numpy() if t.is_floating_point() else t.detach().numpy()
                for name, t in zip(self.inputs, tensors, strict=True)}
        out = evaluate(self.model, host)
        return self._results([torch.tensor(out[n], dtype=torch.float64).to(dt)
                              for n, dt in zip(self.outputs, self._out_dtypes, strict=True)])


def as_op(compiled: CompiledModel, name: str | None = None) -> HabuOp:
    """Register `compiled` as the torch op `habu::<name>` (default: the model's name, sanitised;
    `_2`, `_3`... when another compiled model already holds it) and return it. Registering the same
    `CompiledModel` again returns the op made the first time."""
    for op in _registered.values():
        if op.compiled is compiled and (name is None or op.qualname == f"{NAMESPACE}::{name}"):
            return op
    model = compiled.model
    if {d.name for d in model.inputs} & {d.name for d in model.outputs}:
        raise UsageError(f"{model.name} updates an input in place; a torch op made by as_op returns new "
                         "tensors (call the CompiledModel directly)")
    unsized = unsized_outputs(model)
    if unsized:
        raise UsageError(f"{model.name}: no input has the size of {', '.join(unsized)}, so a traced call "
                         "cannot know its output's shape")
    if name is not None:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UsageError(f"as_op: {name!r} is not an op name (letters, digits and _)")
        if f"{NAMESPACE}::{name}" in _registered:
            raise UsageError(f"as_op: {NAMESPACE}::{name} is already registered for another model")
        candidates = [name]
    else:
        base = sanitise(model.name)
        candidates = [base] + [f"{base}_{i}" for i in range(2, 1000)]
    qualname = next((f"{NAMESPACE}::{c}" for c in candidates if f"{NAMESPACE}::{c}" not in _registered), None)
    if qualname is None:
        raise UsageError(f"as_op: too many ops named after {model.name}")
    op = HabuOp(compiled, qualname)
    _registered[qualname] = op
    return op


__all__ = ["HabuOp", "as_op", "output_shapes", "sanitise", "schema_of", "unsized_outputs"]
