"""`storage:bf16` (or `storage:f16`): every matrix a plan stores between its kernels in that 16-bit type, where the
model's rule (habu/plan/storage.py: the type its matrices share, else f32) would keep f32.

A derived backward whose incoming gradient is f32 (an MoE layer's output, added into by a scatter, is f32, so
its gradient dY is) stores every cotangent in f32, and its grouped products then split each f32 operand into two
bf16 parts; torch's autograd of the same layer keeps its cotangents in bf16. The pin (`--pin storage=bf16`)
rounds them as torch does: a choice of how the plan stores values (the finite-field check is type-blind, the
exact check and the golden tolerance read the plan's storage), never taken by the search or a default, since it
trades precision for speed. Only rank ≥ 2 intermediates change: vectors (row statistics, router weights) keep
f32, and so does a tensor a scatter adds into (its f32 atomics).

An f32 input matrix that a product reads (a node with a Σ, or a scatter-add: the MoE backward's incoming gradient
dY, read by dTact's grouped GEMM and dW2's weight gradient) is read there through a copy in the 16-bit type,
`dY.bf16[i0 i1] = dY[i0 i1]`, a kernel of its own (64 MB of f32 read at 4096 tokens of width 4096): the
products then read one 16-bit operand, not two bf16 parts of an f32 one, as torch's bf16 autograd reads its
bf16 gradient. Other readers (a plain copy: dY_in, the gradient passed through) keep the f32 input."""

from __future__ import annotations

from dataclasses import replace

from habu.spec.dtypes import DTYPES
from habu.spec.ir import Equation, Expr, IndexVar, Load, Model, Reduce, TensorDecl, loads, map_ops, walk

TYPES = ("bf16", "f16")


def _changed(model: Model, dtype: str) -> list[TensorDecl]:
    scattered = {eq.target for eq in model.nodes if eq.scatter is not None}
    return [t for t in model.intermediates if len(t.extents) > 1 and t.name not in scattered
            and (t.dtype is None or t.dtype.name != dtype)]


def _product(eq: Equation) -> bool:
    """A node that multiplies operands: a reduction, or a scatter-add (a weight gradient's `dW[E[r] d h] += …`)."""
    return eq.scatter is not None or any(isinstance(x, Reduce) for x in walk(eq.rhs))


def _copied(model: Model) -> list[TensorDecl]:
    """The f32 input matrices a product reads: each is read there through a 16-bit copy."""
    read = {ld.tensor for eq in model.nodes if _product(eq) for ld in loads(eq.rhs)}
    return [t for t in model.inputs if not t.is_index and t.dtype is not None and t.dtype.name == "f32"
            and len(t.extents) > 1 and t.name in read]


def storage_part(model: Model, dtype: str) -> list[TensorDecl] | None:
    """The intermediates `storage:dtype` stores in `dtype` and the inputs it copies into it; None where it does not
    apply (another type, or nothing to change)."""
    if dtype not in TYPES:
        return None
    return [*_changed(model, dtype), *_copied(model)] or None


def apply_storage(model: Model, dtype: str) -> Model:
    names = {t.name for t in _changed(model, dtype)}
    copies = {t.name: TensorDecl(f"{t.name}.{dtype}", t.extents, DTYPES[dtype]) for t in _copied(model)}
    nodes: list[Equation] = []
    for t in _copied(model):  # the copies first: the inputs are there from the start
        at = tuple(IndexVar(f"i{k}", e) for k, e in enumerate(t.extents))
        nodes.append(Equation(copies[t.name].name, at, Load(t.name, at)))
    for eq in model.nodes:
        nodes.append(replace(eq, rhs=_through(eq.rhs, copies)) if _product(eq) else eq)
    return replace(model, nodes=tuple(nodes), intermediates=(
        *(replace(t, dtype=DTYPES[dtype]) if t.name in names else t for t in model.intermediates),
        *copies.values()))


def _through(e: Expr, copies: dict[str, TensorDecl]) -> Expr:
    """`e` with each load of a copied input reading its copy (inside reductions too)."""
    def leaf(x: Expr) -> Expr:
        if isinstance(x, Load) and x.tensor in copies:
            return Load(copies[x.tensor].name, x.indices)
        return Reduce(x.op, x.vars, _through(x.body, copies)) if isinstance(x, Reduce) else x

    return map_ops(e, leaf)


__all__ = ["TYPES", "apply_storage", "storage_part"]
