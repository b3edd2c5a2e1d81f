"""Leading axes flattened into one row index: what the row kernels (an N-D tensor's rows, reduced along
the last axis) and the column kernels (a reduction over several leading axes, `Σ b Σ s dY[b s n]`) share.

Row r of leading extents (E0, E1, ..., Ek) is, row-major (the last leading axis fastest), the coordinates
e_k = r % #Ek, e_{k-1} = (r / #Ek) % #E{k-1}, ..., e_0 = r / (#E1·...·#Ek). Every access reads its
leading positions through this map: the emitter prints it (C), the finite-field interpreter runs it
(numpy), the rules evaluate it (z3); all with `+`, `*`, `%` and `floordiv` only. One leading extent is
its own coordinate, the axis `r`; several are the axes `r#0`, `r#1`, ... (no index variable of the
language has a `#`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from habu.lower.access import floordiv


def row_axis_names(count: int) -> tuple[str, ...]:
    """The kernel axes of `count` leading axes: `r` for one, `r#0`, `r#1`, ... flattened."""
    return ("r",) if count == 1 else tuple(f"r#{i}" for i in range(count))


def is_row_axis(name: str) -> bool:
    """A leading axis of the lowering: `r`, or `r#i`."""
    return name == "r" or name.startswith("r#")


def row_count(leading: tuple[str, ...], sizes: Mapping[str, Any]) -> Any:
    """Rows: the product of the leading extents' sizes (ints, z3 terms or C)."""
    n = sizes[leading[0]]
    for e in leading[1:]:
        n = n * sizes[e]
    return n


def row_coordinates(leading: tuple[str, ...], r: Any, sizes: Mapping[str, Any]) -> dict[str, Any]:
    """The leading coordinates of flattened row r, by axis name (`row_axis_names`)."""
    axes = row_axis_names(len(leading))
    if len(axes) == 1:
        return {"r": r}
    out: dict[str, Any] = {}
    rest = r
    for i in reversed(range(1, len(axes))):
        size = sizes[leading[i]]
        out[axes[i]] = rest % size
        rest = floordiv(rest, size)
    out[axes[0]] = rest
    return out


class FlattenedRows:
    """What a lowering with leading axes `leading` (a tuple of extent names, its field) flattened into one
    row index answers: the kernel axes, the row count and each row's coordinates (row and column kernels)."""

    leading: tuple[str, ...]

    @property
    def row_axes(self) -> tuple[str, ...]:
        """The kernel axes of the leading coordinates (`r` alone for one leading axis)."""
        return row_axis_names(len(self.leading))

    @property
    def rows_name(self) -> str:
        """The row count for a message: `R`, or `B·#S` (printed after a `#`)."""
        return "·#".join(self.leading)

    def rows(self, sizes: Mapping[str, Any]) -> Any:
        """Rows the kernel computes: the product of the leading extents' sizes (ints, z3 terms or C)."""
        return row_count(self.leading, sizes)

    def row_coordinates(self, r: Any, sizes: Mapping[str, Any]) -> dict[str, Any]:
        """The leading coordinates of flattened row r, row-major (the last leading axis fastest): the row
        index → coordinates map every access reads through. One leading axis is its own coordinate."""
        return row_coordinates(self.leading, r, sizes)
