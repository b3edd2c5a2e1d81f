"""The batch axes of a batched kernel (a contraction's batch indices as a grid dimension, and the staging pass
that copies one of its operands): their names, and the coordinates of a linear batch index."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from habu.lower.access import floordiv


def batch_axis(i: int) -> str:
    """The kernel axis of a batched contraction's i-th batch index (outermost first)."""
    return f"batch{i}"


def is_batch_axis(axis: str) -> bool:
    return axis.startswith("batch")


def batch_coordinates(extents: tuple[str, ...], z: Any, s: Mapping[str, Any],
                      let: Callable[[str, Any], Any] | None = None, axes: tuple[str, ...] | None = None
                      ) -> dict[str, Any]:
    """The batch axes' coordinates of linear batch z over batch extents `extents` (outermost first; the last
    varies fastest), the axes `axes` (default batch0, batch1, ...). `let` names each intermediate value (the
    emitters declare them)."""
    name = let or (lambda _name, value: value)
    names = axes if axes is not None else tuple(batch_axis(i) for i in range(len(extents)))
    out: dict[str, Any] = {}
    rest = z
    for i in reversed(range(len(extents))):
        axis, size = names[i], s[extents[i]]
        if i == 0:
            out[axis] = rest
        else:
            q = name(f"{axis}_rest", floordiv(rest, size))
            out[axis] = name(f"{axis}_of_batch", rest - q * size)  # not the axis's own name: the emitter declares that
            rest = q
    return dict(sorted(out.items()))


__all__ = ["batch_axis", "batch_coordinates", "is_batch_axis"]
