"""How a plan stores what it does not keep on chip: the element type of each intermediate, and so of
every tensor a kernel reads or writes (the search, the lowering's callers and the timing baselines ask)."""

from __future__ import annotations

from habu.spec.dtypes import activation_dtype, over_fewer_axes
from habu.spec.ir import Model


def storage_dtypes(model: Model) -> dict[str, str]:
    """Intermediates are stored in the 16-bit float type the model's matrices share (`activation_dtype`:
    a vector input such as a saved f32 row statistic or a router weight does not decide it), else f32."""
    dt = activation_dtype(model.inputs, frozenset(t.name for t in model.outputs))
    # a vector, or a statistic over some of another tensor's axes (a row statistic such as a normalisation's
    # scale, attention's D[b g r i]) is small: it keeps f32
    # an intermediate a rewrite declared with its type keeps it (`scatter:T`'s f32 product)
    axes = [t.extents for t in (*model.inputs, *model.intermediates)]
    return {t.name: t.dtype.name if t.dtype is not None
            else "f32" if len(t.extents) <= 1 or over_fewer_axes(t.extents, axes) else dt
            for t in model.intermediates}


def dtype_of(model: Model, tensor: str) -> str:
    d = model.tensor(tensor).dtype
    return d.name if d else storage_dtypes(model).get(tensor, "f32")


def dtype_bytes(model: Model, tensor: str) -> int:
    from habu.spec.dtypes import DTYPES

    return DTYPES[dtype_of(model, tensor)].bytes
