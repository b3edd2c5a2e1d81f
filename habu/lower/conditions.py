"""A condition on indices in a contraction's epilogue (`where(j ≤ i + #J − #I, acc · s, −∞)`), over the
kernel's axes.

`lower_contraction` renames each epilogue node's index variables to the kernel's axes ("m", "n", "batch0",
...); a condition's variables are then renamed once more, to `condition_axis` names ("@m", "@n", "@batch0"),
which no C identifier and no access coordinate shares. The finite-field check evaluates a condition at the
stored element's coordinates under those names (`condition_coordinates`), and an emitter prints it with the
C of each coordinate (`condition_names`): an emitter that printed an epilogue without them would print "@m",
which does not compile, rather than some other variable called m."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from habu.spec.ir import Compare, Expr, IndexExpr, IndexVar, map_ops

PREFIX = "@"
T = TypeVar("T")


def condition_axis(axis: str) -> str:
    """The name a condition's variable on kernel axis `axis` has in the lowering's epilogue."""
    return PREFIX + axis


def conditions_on_axes(expr: Expr) -> Expr:
    """`expr` (over the kernel's axes) with each condition's variables renamed to `condition_axis` names."""

    def rename(ix: IndexExpr) -> IndexExpr:
        if isinstance(ix, IndexVar) and not ix.name.startswith(PREFIX):
            return IndexVar(condition_axis(ix.name), ix.extent)
        return ix

    return map_ops(expr, lambda e: e.map_indices(rename) if isinstance(e, Compare) else e)


def condition_coordinates(coords: Mapping[str, T]) -> dict[str, T]:
    """The coordinates of the kernel's axes (by axis) under the names an epilogue's conditions read."""
    return {condition_axis(axis): value for axis, value in coords.items()}


def condition_names(m: str, n: str, batch_axes: tuple[str, ...] = ()) -> dict[str, str]:
    """The C of each condition variable: the element's row `m` and column `n` as the emitter prints them, a
    batch axis its kernel constant (`batch0`, as the accesses read it)."""
    return {condition_axis("m"): m, condition_axis("n"): n, **{condition_axis(b): b for b in batch_axes}}


__all__ = ["condition_axis", "condition_coordinates", "condition_names", "conditions_on_axes"]
