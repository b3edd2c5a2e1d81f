"""torch.nn layers whose CUDA forward runs a proven Habu kernel: RMSNorm, Linear, FFN.

    import habu.nn
    norm = habu.nn.RMSNorm(4096).to("cuda", torch.bfloat16)   # a torch.nn.RMSNorm: same weight, same state dict
    proj = habu.nn.Linear(4096, 11008, activation="gelu")      # a torch.nn.Linear, then the activation
    ffn = habu.nn.FFN(4096, 14336)                             # RMSNORM(fc2(GELU(fc1(x))) + x), examples/ffn_skip.habu

`RMSNorm` and `Linear` subclass torch's own modules (parameters `weight`, `bias`, their
initialisation and `load_state_dict` are torch's); `FFN` holds two `torch.nn.Linear`s, `fc1` and
`fc2`. Each layer's computation is a Habu model written from the prelude's words (MATMUL-T, ADD,
GELU, RMSNORM-W...; `layer.habu_source(torch.bfloat16)` prints it). A forward calls one torch
custom op (`torch.ops.habu_nn.rms_norm`, `.linear`, `.ffn`), so `torch.compile(fullgraph=True)`
traces it without a graph break:

- on CUDA, the first call for a row count (every dimension but the last, flattened), dtype and
  device writes the model to `<habu cache>/nn/<hash>.habu` and builds it with `habu.build` (prove,
  emit, NVRTC: seconds); later calls with that shape reuse it. Where Habu has no proven plan (the
  build raises a HabuError: warned once per shape), where the tensors' dtypes differ or are not
  bf16/f16/f32, or where there are no rows, the op runs the torch implementation instead;
- on any other device (the CPU), the op runs the torch implementation: the reference the CPU tests
  compare with torch's own modules.

The kernels launch on torch's current CUDA stream (habu.torch_ops). Gradients are computed by
torch: the ops' backward differentiates the torch implementation, recomputed from the saved inputs.
This module imports torch; `import habu` never imports it.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from habu.errors import HabuError, UsageError

PRELUDE_EPS = 1e-6  # the epsilon the prelude's RMSNORM and RMSNORM-W are written with
_HABU_DTYPES = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}
ACTIVATIONS: dict[str, tuple[str, Callable[[Any], Any]]] = {  # name -> (prelude word, torch function)
    "gelu": ("GELU", F.gelu),
    "gelu_tanh": ("GELU-TANH", lambda x: F.gelu(x, approximate="tanh")),
    "relu": ("RELU", F.relu),
    "silu": ("SILU", F.silu),
}


def _activation(name: str | None) -> str:
    if name is None or name == "":
        return ""
    if name not in ACTIVATIONS:
        raise UsageError(f"activation {name!r}: Habu's layers have {', '.join(ACTIVATIONS)} (or None)")
    return name


# ----------------------------------------------------------------------------- the Habu models


def _rmsnorm_word(eps: float, weighted: bool) -> tuple[str, str]:
    """The word that normalises: the prelude's when `eps` is its 1e-6, else the same definition
    with this epsilon (returned as a WORD: line to put in the file)."""
    name = "RMSNORM-W" if weighted else "RMSNORM"
    if eps == PRELUDE_EPS:
        return name, ""
    if not eps > 0:
        raise UsageError(f"RMSNorm eps must be positive, got {eps}")
    w, times_w = (" w[one d]", " · w[0 d]") if weighted else ("", "")
    definition = (f"WORD: {name}-EPS ( x[r d]{w} -- y[r d] )\n"
                  f"   y[r d] = x[r d] · rsqrt(Σ d' x[r d'] · x[r d'] / #d + {float(eps)!r}){times_w} ;\n")
    return f"{name}-EPS", definition


def _rows_header(what: str) -> str:
    return (f"\\ {what}\n"
            "? EXTENT: #R                        \\ rows: every dimension of x but the last (bound per call)\n"
            "1 EXTENT: #ONE                      \\ biases and norm weights are one row\n")


LINEAR_T = (": LINEAR-T ( x -- y | w b ) w MATMUL-T b ADD ;   \\ torch's layout: w is (out, in)\n"
            ": LINEAR-T-NB ( x -- y | w ) w MATMUL-T ;\n")


def rmsnorm_source(dim: int, eps: float, weighted: bool, dtype: str) -> str:
    """torch.nn.RMSNorm over the last dimension: y = x · rsqrt(mean(x²) + eps) · w."""
    word, definition = _rmsnorm_word(eps, weighted)
    return (_rows_header("habu.nn.RMSNorm: y = x · rsqrt(mean(x²) + eps) · w over the last dimension")
            + f"{dim} EXTENT: #D\n"
            + f"{dtype} TENSOR: X ( #R #D )\n"
            + (f"{dtype} TENSOR: W ( #ONE #D )\n" if weighted else "")
            + f"{dtype} TENSOR: Y ( #R #D )\n"
            + definition
            + f"MODEL: NN-RMSNORM ( x{' w' if weighted else ''} -- y ) {word} ;\n")


def linear_source(in_features: int, out_features: int, bias: bool, activation: str, dtype: str) -> str:
    """torch.nn.Linear, then an activation: y = act(x · wᵀ + b)."""
    act = f" {ACTIVATIONS[activation][0]}" if activation else ""
    return (_rows_header("habu.nn.Linear: y = act(x · wᵀ + b), w stored (out, in) as torch.nn.Linear keeps it")
            + f"{in_features} EXTENT: #I\n{out_features} EXTENT: #O\n"
            + f"{dtype} TENSOR: X ( #R #I )\n{dtype} TENSOR: W ( #O #I )\n"
            + (f"{dtype} TENSOR: B ( #ONE #O )\n" if bias else "")
            + f"{dtype} TENSOR: Y ( #R #O )\n"
            + LINEAR_T
            + (f"MODEL: NN-LINEAR ( x w b -- y ) LINEAR-T{act} ;\n" if bias
               else f"MODEL: NN-LINEAR ( x w -- y ) LINEAR-T-NB{act} ;\n"))


def ffn_source(dim: int, hidden: int, eps: float, activation: str, dtype: str) -> str:
    """examples/ffn_skip.habu with torch's weight layout: y = RMSNORM(fc2(act(fc1(x))) + x)."""
    word, definition = _rmsnorm_word(eps, False)
    return (_rows_header("habu.nn.FFN: y = RMSNORM(fc2(act(fc1(x))) + x), as examples/ffn_skip.habu")
            + f"{dim} EXTENT: #D\n{hidden} EXTENT: #H\n"
            + f"{dtype} TENSOR: X ( #R #D )\n"
            + f"{dtype} TENSOR: W1 ( #H #D )\n{dtype} TENSOR: B1 ( #ONE #H )\n"
            + f"{dtype} TENSOR: W2 ( #D #H )\n{dtype} TENSOR: B2 ( #ONE #D )\n"
            + f"{dtype} TENSOR: Y ( #R #D )\n"
            + LINEAR_T + definition
            + f"MODEL: NN-FFN ( x w1 b1 w2 b2 -- y ) LINEAR-T {ACTIVATIONS[activation][0]} LINEAR-T "
              f"x RESIDUAL-ADD {word} ;\n")


# ----------------------------------------------------------------------------- building, once per shape

_builds: dict[tuple, Any] = {}  # (source, rows, device index) -> CompiledModel, or None: use torch


def source_dir() -> Path:
    """Where the layers' model files are written: `<habu cache>/nn`."""
    from habu.emit_cuda.cache import cache_dir

    return cache_dir().parent / "nn"


def _write_source(text: str) -> Path:
    path = source_dir() / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.habu"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{id(text)}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path


def built_for(text: str, model: str, rows: int, device: Any) -> Any:
    """The CompiledModel of `text` at #R = rows, built on first use; None where Habu has no proven
    plan for it (warned once: the layer then runs torch)."""
    key = (text, rows, device.index)
    if key not in _builds:
        from habu.api import build

        path = _write_source(text)
        try:
            _builds[key] = build(path, model, R=rows)
        except HabuError as err:
            warnings.warn(f"habu.nn: no Habu kernel for {model} at {rows} rows ({path}): "
                          f"{err.message}; running torch instead", stacklevel=3)
            _builds[key] = None
    return _builds[key]


def _habu_dtype(*tensors: Any) -> str | None:
    """The Habu dtype all the (present) tensors share, on one CUDA device; None when they do not."""
    present = [t for t in tensors if t is not None]
    first = present[0]
    if first.device.type != "cuda" or first.dtype not in _HABU_DTYPES:
        return None
    if any(t.dtype != first.dtype or t.device != first.device for t in present):
        return None
    return _HABU_DTYPES[first.dtype]


def _rows(x: Any) -> int:
    n = 1
    for s in x.shape[:-1]:
        n *= int(s)
    return n


# ----------------------------------------------------------------------------- the torch implementations


def rms_norm_reference(x: Any, weight: Any, eps: float) -> Any:
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def linear_reference(x: Any, weight: Any, bias: Any, activation: str) -> Any:
    y = F.linear(x, weight, bias)
    return ACTIVATIONS[activation][1](y) if activation else y


def ffn_reference(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, eps: float, activation: str) -> Any:
    h = F.linear(ACTIVATIONS[activation][1](F.linear(x, w1, b1)), w2, b2)
    return F.rms_norm(h + x, (x.shape[-1],), None, eps)


# ----------------------------------------------------------------------------- the CUDA implementations


def _rms_norm_cuda(x: Any, weight: Any, eps: float) -> Any:
    dtype, rows, dim = _habu_dtype(x, weight), _rows(x), x.shape[-1]
    built = built_for(rmsnorm_source(dim, eps, weight is not None, dtype), "NN-RMSNORM", rows, x.device) \
        if dtype and rows else None
    if built is None:
        return rms_norm_reference(x, weight, eps)
    args = {"X": x.reshape(rows, dim).contiguous()}
    if weight is not None:
        args["W"] = weight.reshape(1, dim).contiguous()
    return built(**args).reshape(x.shape)


def _linear_cuda(x: Any, weight: Any, bias: Any, activation: str) -> Any:
    dtype, rows = _habu_dtype(x, weight, bias), _rows(x)
    out_features, in_features = weight.shape
    built = built_for(linear_source(in_features, out_features, bias is not None, activation, dtype),
                      "NN-LINEAR", rows, x.device) if dtype and rows else None
    if built is None:
        return linear_reference(x, weight, bias, activation)
    args = {"X": x.reshape(rows, in_features).contiguous(), "W": weight.contiguous()}
    if bias is not None:
        args["B"] = bias.reshape(1, out_features).contiguous()
    return built(**args).reshape(*x.shape[:-1], out_features)


def _ffn_cuda(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, eps: float, activation: str) -> Any:
    dtype, rows = _habu_dtype(x, w1, b1, w2, b2), _rows(x)
    hidden, dim = w1.shape
    built = built_for(ffn_source(dim, hidden, eps, activation, dtype), "NN-FFN", rows, x.device) \
        if dtype and rows else None
    if built is None:
        return ffn_reference(x, w1, b1, w2, b2, eps, activation)
    y = built(X=x.reshape(rows, dim).contiguous(), W1=w1.contiguous(), B1=b1.reshape(1, hidden).contiguous(),
              W2=w2.contiguous(), B2=b2.reshape(1, dim).contiguous())
    return y.reshape(x.shape)


# ----------------------------------------------------------------------------- the ops


def _check_features(what: str, x: Any, n: int) -> None:
    if x.dim() == 0 or x.shape[-1] != n:
        raise UsageError(f"{what}: expected the last dimension of x to be {n}, got shape {tuple(x.shape)}")


def _fake_rms_norm(x: Any, weight: Any, eps: float) -> Any:
    if weight is not None:
        _check_features("habu_nn.rms_norm", x, weight.shape[-1])
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _fake_linear(x: Any, weight: Any, bias: Any, activation: str) -> Any:
    _check_features("habu_nn.linear", x, weight.shape[1])
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _fake_ffn(x: Any, w1: Any, b1: Any, w2: Any, b2: Any, eps: float, activation: str) -> Any:
    _check_features("habu_nn.ffn", x, w1.shape[1])
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _with_torch_gradient(op: Any, reference: Callable[..., Any]) -> None:
    """Register a backward that differentiates `reference` (recomputed from the saved inputs)."""

    def setup_context(ctx: Any, inputs: tuple, output: Any) -> None:
        ctx.tensor_at = [isinstance(a, torch.Tensor) for a in inputs]
        ctx.constants = [None if t else a for a, t in zip(inputs, ctx.tensor_at, strict=True)]
        ctx.save_for_backward(*[a for a, t in zip(inputs, ctx.tensor_at, strict=True) if t])

    def backward(ctx: Any, grad: Any) -> tuple:
        saved = iter(ctx.saved_tensors)
        args = [next(saved).detach().requires_grad_(need) if t else c
                for t, c, need in zip(ctx.tensor_at, ctx.constants, ctx.needs_input_grad, strict=True)]
        wrt = [a for a, need in zip(args, ctx.needs_input_grad, strict=True) if need]
        with torch.enable_grad():
            grads = iter(torch.autograd.grad(reference(*args), wrt, grad, allow_unused=True))
        return tuple(next(grads) if need else None for need in ctx.needs_input_grad)

    op.register_autograd(backward, setup_context=setup_context)


def _define(name: str, schema: str, cuda: Callable[..., Any], reference: Callable[..., Any],
            fake: Callable[..., Any]) -> Any:
    op = torch.library.custom_op(f"habu_nn::{name}", cuda, mutates_args=(), device_types="cuda", schema=schema)
    op.register_kernel("cpu", reference)
    op.register_fake(fake)
    _with_torch_gradient(op, reference)
    return op


rms_norm = _define("rms_norm", "(Tensor x, Tensor? weight, float eps) -> Tensor",
                   _rms_norm_cuda, rms_norm_reference, _fake_rms_norm)
linear = _define("linear", "(Tensor x, Tensor weight, Tensor? bias, str activation) -> Tensor",
                 _linear_cuda, linear_reference, _fake_linear)
ffn = _define("ffn", "(Tensor x, Tensor w1, Tensor b1, Tensor w2, Tensor b2, float eps, str activation) -> Tensor",
              _ffn_cuda, ffn_reference, _fake_ffn)


# ----------------------------------------------------------------------------- the layers


class RMSNorm(torch.nn.RMSNorm):
    """torch.nn.RMSNorm over the last dimension, run by Habu on CUDA (`eps=None`: the epsilon torch
    uses, float32's for 16-bit inputs). A normalized_shape of several dimensions runs torch's forward."""

    def _eps(self, dtype: Any) -> float:
        """torch's epsilon for `eps=None`: the machine epsilon of the type F.rms_norm computes in
        (float32 for bf16/f16 inputs, not their own 2^-7 or 2^-10, which torch's docs suggest)."""
        if self.eps is not None:
            return float(self.eps)
        return float(torch.finfo(torch.promote_types(dtype, torch.float32)).eps)

    def forward(self, x: Any) -> Any:
        if len(self.normalized_shape) != 1:
            return super().forward(x)
        return rms_norm(x, self.weight, self._eps(x.dtype))

    def habu_source(self, dtype: Any = torch.bfloat16) -> str:
        """The Habu model this layer runs for inputs of `dtype`."""
        return rmsnorm_source(self.normalized_shape[-1], self._eps(dtype), self.weight is not None,
                              _HABU_DTYPES[dtype])


class Linear(torch.nn.Linear):
    """torch.nn.Linear, then an optional activation (None, "gelu", "gelu_tanh", "relu", "silu"),
    run by Habu on CUDA as one kernel (the activation in the GEMM's epilogue where the plan fuses it)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, activation: str | None = None,
                 device: Any = None, dtype: Any = None):
        self.activation = _activation(activation)
        super().__init__(in_features, out_features, bias, device, dtype)

    def forward(self, x: Any) -> Any:
        return linear(x, self.weight, self.bias, self.activation)

    def habu_source(self, dtype: Any = torch.bfloat16) -> str:
        return linear_source(self.in_features, self.out_features, self.bias is not None, self.activation,
                             _HABU_DTYPES[dtype])

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", activation={self.activation!r}" if self.activation else "")


class FFN(torch.nn.Module):
    """y = RMSNORM(fc2(act(fc1(x))) + x): examples/ffn_skip.habu, with `fc1`, `fc2` torch.nn.Linear
    layers (weights stored (out, in)) and a normalisation without weight (`eps`, default the
    prelude's 1e-6)."""

    def __init__(self, dim: int, hidden: int, eps: float = PRELUDE_EPS, activation: str = "gelu",
                 device: Any = None, dtype: Any = None):
        super().__init__()
        self.dim, self.hidden, self.eps = dim, hidden, float(eps)
        self.activation = _activation(activation)
        if not self.activation:
            raise UsageError("FFN needs an activation (gelu, gelu_tanh, relu, silu)")
        self.fc1 = torch.nn.Linear(dim, hidden, device=device, dtype=dtype)
        self.fc2 = torch.nn.Linear(hidden, dim, device=device, dtype=dtype)

    def forward(self, x: Any) -> Any:
        return ffn(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias, self.eps, self.activation)

    def reference(self, x: Any) -> Any:
        """The same block in plain torch."""
        return ffn_reference(x, self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias, self.eps,
                             self.activation)

    def habu_source(self, dtype: Any = torch.bfloat16) -> str:
        return ffn_source(self.dim, self.hidden, self.eps, self.activation, _HABU_DTYPES[dtype])

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, eps={self.eps}, activation={self.activation!r}"


__all__ = ["ACTIVATIONS", "FFN", "Linear", "RMSNorm", "built_for", "ffn", "ffn_source", "linear", "linear_source",
           "rms_norm", "rmsnorm_source", "source_dir"]
