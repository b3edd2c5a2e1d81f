"""What an expert would call instead of Habu, timed in the same run: the ratio every figure quotes.

For a model that is one contraction (GEMM, gathered GEMM, MoE up-projection) the baseline is torch:
`A[IX] @ B.T` (cuBLAS after a gather). An f32 output of 16-bit operands is written by cuBLAS itself
(`torch.mm(..., out_dtype=torch.float32)`, torch >= 2.8), not rounded to 16 bits and converted.
Any other model runs as torch eager ops (`habu.timing.torch_eager`), with the library's words as
their expert calls (`F.rms_norm`, `torch.softmax`, `F.gelu`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from habu.plan.patterns import Operand, as_contraction
from habu.plan.storage import dtype_of
from habu.spec.ir import Const, Model
from habu.timing.harness import TORCH_DTYPE


def torch_baseline(model: Model, inputs: dict[str, Any]) -> tuple[str, Callable[[dict[str, Any]], Any]] | None:
    """(a description, a function of the inputs) for the torch equivalent, or None."""
    c = as_contraction(model.nodes[0]) if len(model.nodes) == 1 else None
    # (a gather on the reduction axis or a scatter-add store, GGEMM's backward, is torch eager's: index_add)
    if c is None or c.batch or (c.scale is not None and not isinstance(c.scale, Const)) or c.node.scatter is not None \
            or c.a.k_gather or c.b.k_gather:
        from habu.timing.torch_eager import eager_baseline

        return eager_baseline(model, _sizes(model, inputs))
    import torch

    out_dtype = getattr(torch, TORCH_DTYPE[dtype_of(model, c.node.target)])
    scale = float(c.scale.value) if isinstance(c.scale, Const) else None
    transpose_out = c.node.lhs[0] != c.m

    def operand(op: Operand, args: dict[str, Any]) -> Any:
        x = args[op.load.tensor]
        if op.gather is not None:
            x = x.index_select(op.axis_pos, args[op.gather].reshape(-1).long())
        return x if op.axis_pos == 0 else x.t()  # rows: the axis, columns: k

    cublas_f32 = (out_dtype == torch.float32 and dtype_of(model, c.a.load.tensor) in ("bf16", "f16")
                  and _has_out_dtype())

    def run(args: dict[str, Any]) -> Any:
        a, b = operand(c.a, args), operand(c.b, args).t()
        y = torch.mm(a, b, out_dtype=torch.float32) if cublas_f32 else a @ b
        if scale is not None:
            y = y * scale
        y = y.t() if transpose_out else y
        return y.to(out_dtype)

    a, b = c.a.load.tensor, c.b.load.tensor
    gathered = f"{a}{'[' + c.a.gather + ']' if c.a.gather else ''}"
    text = f"torch mm({gathered}, {b}.T, out_dtype=float32)" if cublas_f32 else f"torch {gathered} @ {b}.T"
    return text, run


def _has_out_dtype() -> bool:
    """Whether this torch's mm takes out_dtype (2.8 and later)."""
    import torch

    try:
        x = torch.zeros(1, 1, dtype=torch.bfloat16, device="cuda" if torch.cuda.is_available() else "cpu")
        torch.mm(x, x, out_dtype=torch.float32)
    except (TypeError, RuntimeError):
        return False
    return True


def _sizes(model: Model, inputs: dict[str, Any]) -> dict[str, int]:
    """Every extent's size: the model's, or read off an input's shape for a runtime extent."""
    sizes = {e.name: e.size for e in model.extents if e.size is not None}
    for t in model.inputs:
        if t.name in inputs:
            for ext, n in zip(t.extents, inputs[t.name].shape, strict=False):
                sizes.setdefault(ext, int(n))
    return sizes
