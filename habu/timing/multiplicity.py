"""How many points of a scatter's domain land on one element, for the index values a check runs with.

The exact check (habu.timing.exact) bounds a scatter-add's target by its prior contents plus the added
value times the number of domain points that may store to one element. Without the index values, that
number is every combination of the gathered variables (all of them duplicates: `dA[IX[m] k] += …` over
4096 rows may put 4096 terms on one row), which made a 4096-row scatter "not applicable" in float32. With
the index tensors the check actually feeds the kernels, the number is counted: the largest group of
gathered-variable assignments whose stored element is the same (a handful for random indices).
"""

from __future__ import annotations

from collections.abc import Mapping
from math import prod

import numpy as np

from habu.spec.ir import Equation, Gather, IndexConst, IndexExpr, IndexVar, index_subexprs

MAX_ENUMERATED = 1 << 24  # gathered-variable assignments counted; beyond it, the worst case is assumed


def gathered_vars(eq: Equation) -> list[IndexVar]:
    """The index variables read inside the scatter's gathers, in order of first appearance."""
    found: dict[str, IndexVar] = {}
    for axis in eq.scatter or ():
        for sub in index_subexprs(axis):
            if isinstance(sub, Gather):
                for inner in sub.indices:
                    for v in index_subexprs(inner):
                        if isinstance(v, IndexVar):
                            found.setdefault(v.name, v)
    return list(found.values())


def _values(ix: IndexExpr, grid: Mapping[str, np.ndarray], indices: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """The axis's value at every assignment of the gathered variables (broadcast arrays), or None where
    it does not depend on them (a constant, a variable outside the gathers: the same for every point of
    one target element)."""
    if isinstance(ix, IndexConst):
        return None
    if isinstance(ix, IndexVar):
        return grid.get(ix.name)
    assert isinstance(ix, Gather)
    coords = []
    for inner in ix.indices:
        v = _values(inner, grid, indices)
        coords.append(np.asarray(inner.value if isinstance(inner, IndexConst) else 0) if v is None else v)
    return np.asarray(indices[ix.tensor])[tuple(np.broadcast_arrays(*coords))] if coords else None


def scatter_multiplicity(eq: Equation, sizes: Mapping[str, int], indices: Mapping[str, np.ndarray] | None) -> int:
    """The most domain points of scatter `eq` that store to one element: counted on `indices` (the index
    tensors' values) where given and small enough, else every combination of the gathered variables."""
    gathered = gathered_vars(eq)
    worst = prod(sizes[v.extent] for v in gathered)
    if indices is None or worst > MAX_ENUMERATED or not gathered:
        return worst
    if any(sub.tensor not in indices for axis in eq.scatter or () for sub in index_subexprs(axis)
           if isinstance(sub, Gather)):
        return worst
    axes = np.meshgrid(*(np.arange(sizes[v.extent]) for v in gathered), indexing="ij", sparse=True)
    grid = {v.name: a for v, a in zip(gathered, axes, strict=True)}
    shape = tuple(sizes[v.extent] for v in gathered)
    columns = [np.broadcast_to(vals, shape).reshape(-1) for axis in eq.scatter or ()
               if (vals := _values(axis, grid, indices)) is not None]
    if not columns:
        return worst
    _, counts = np.unique(np.stack(columns, axis=1), axis=0, return_counts=True)
    return int(counts.max())


__all__ = ["MAX_ENUMERATED", "gathered_vars", "scatter_multiplicity"]
