"""What an expert would call instead of Habu, timed in the same run: the ratio every figure quotes.

For a model that is one contraction (GEMM, gathered GEMM, MoE up-projection) the baseline is torch:
`A[IX] @ B.T` (cuBLAS after a gather), in the storage dtype, with the result converted to the
output's dtype. Other models have no automatic baseline yet: `habu.bench.torch_eager` runs any
model as torch ops, equation by equation, and is checked for correctness on the GPU, but its speed
against hand-written torch is not settled; `docs/PERF.md` names the hand-written baselines used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from habu.search.patterns import Operand, as_contraction
from habu.spec.ir import Const, Model


def torch_baseline(model: Model, inputs: dict[str, Any]) -> tuple[str, Callable[[dict[str, Any]], Any]] | None:
    """(a description, a function of the inputs) for the torch equivalent, or None."""
    if len(model.nodes) != 1:
        return None
    c = as_contraction(model.nodes[0])
    if c is None or (c.scale is not None and not isinstance(c.scale, Const)):
        return None
    import torch

    out_decl = model.tensor(c.node.target)
    out_dtype = getattr(torch, {"bf16": "bfloat16", "f16": "float16", "f32": "float32"}.get(
        out_decl.dtype.name if out_decl.dtype else "f32", "float32"))
    scale = float(c.scale.value) if isinstance(c.scale, Const) else None
    transpose_out = c.node.lhs[0] != c.m

    def operand(op: Operand, args: dict[str, Any]) -> Any:
        x = args[op.load.tensor]
        if op.gather is not None:
            x = x.index_select(op.axis_pos, args[op.gather].reshape(-1).long())
        return x if op.axis_pos == 0 else x.t()  # rows: the axis, columns: k

    def run(args: dict[str, Any]) -> Any:
        y = operand(c.a, args) @ operand(c.b, args).t()
        if scale is not None:
            y = y * scale
        y = y.t() if transpose_out else y
        return y.to(out_dtype)

    a, b = c.a.load.tensor, c.b.load.tensor
    text = f"torch {a}{'[' + c.a.gather + ']' if c.a.gather else ''} @ {b}.T"
    return text, run
