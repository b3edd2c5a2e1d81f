"""`storage:bf16` (or `storage:f16`): every matrix a plan stores between its kernels in that 16-bit type, where the
model's rule (habu/plan/storage.py: the type its matrices share, else f32) would keep f32.

A derived backward whose incoming gradient is f32 (an MoE layer's output, added into by a scatter, is f32, so
its gradient dY is) stores every cotangent in f32, and its grouped products then split each f32 operand into two
bf16 parts; torch's autograd of the same layer keeps its cotangents in bf16. The pin (`--pin storage=bf16`)
rounds them as torch does: a choice of how the plan stores values (the finite-field check is type-blind, the
exact check and the golden tolerance read the plan's storage), never taken by the search or a default, since it
trades precision for speed. Only rank ≥ 2 intermediates change: vectors (row statistics, router weights) keep
f32, and so does a tensor a scatter adds into (its f32 atomics)."""

from __future__ import annotations

from dataclasses import replace

from habu.spec.dtypes import DTYPES
from habu.spec.ir import Model, TensorDecl

TYPES = ("bf16", "f16")


def _changed(model: Model, dtype: str) -> list[TensorDecl]:
    scattered = {eq.target for eq in model.nodes if eq.scatter is not None}
    return [t for t in model.intermediates if len(t.extents) > 1 and t.name not in scattered
            and (t.dtype is None or t.dtype.name != dtype)]


def storage_part(model: Model, dtype: str) -> list[TensorDecl] | None:
    """The intermediates `storage:dtype` stores in `dtype`; None where it does not apply (another type, or
    nothing to change)."""
    if dtype not in TYPES:
        return None
    return _changed(model, dtype) or None


def apply_storage(model: Model, dtype: str) -> Model:
    names = {t.name for t in _changed(model, dtype)}
    return replace(model, intermediates=tuple(replace(t, dtype=DTYPES[dtype]) if t.name in names else t
                                              for t in model.intermediates))


__all__ = ["TYPES", "apply_storage", "storage_part"]
