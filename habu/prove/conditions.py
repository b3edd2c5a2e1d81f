"""Where a condition on indices holds, at given coordinates: the general kernel's conditions, the attention
kernels' masks and a contraction epilogue's (habu/lower/conditions.py), as the kernels' printed conditions
compute them (`habu.emit_cuda.common.condition_code`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from habu.spec.ir import Compare, Gather, IndexVar


def condition_holds(e: Compare, at: Mapping[str, np.ndarray], sizes: Mapping[str, int], mem: Any) -> np.ndarray:
    """Where a condition on indices holds, with its variables at the coordinates `at` (by name); a
    gather `LEN[b]` reads the index tensor at b (as the kernel does: `condition_code`)."""

    def term(ix) -> np.ndarray:
        if isinstance(ix, IndexVar):
            return np.asarray(at[ix.name], dtype=np.int64)
        if isinstance(ix, Gather):
            return np.asarray(mem.table(ix.tensor).at(np.asarray(at[ix.indices[0].name], dtype=np.int64)),
                              dtype=np.int64)
        return np.asarray(ix.value, dtype=np.int64)

    def side(a) -> np.ndarray:
        total = np.asarray(a.const + sum(k * sizes[x] for k, x in a.sizes), dtype=np.int64)
        for k, ix in a.terms:
            total = total + k * term(ix)
        return total

    ops = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
           "ne": np.not_equal}
    return ops[e.op](side(e.left), side(e.right))


def condition_formula(e: Compare, var: Mapping[str, Any], ext: Mapping[str, Any], tables: dict[str, Any]) -> Any:
    """The condition as a z3 formula: its variables at `var` (by name), extents at `ext` (ints or z3 terms), a gather
    `LEN[b]` one z3 integer per index tensor (`tables`, filled on first use: any value it may hold)."""
    import z3

    def side(a) -> Any:
        total: Any = a.const
        for k, x in a.sizes:
            total = total + k * ext[x]
        for k, ix in a.terms:
            if isinstance(ix, IndexVar):
                value = var[ix.name]
            elif isinstance(ix, Gather):
                value = tables.setdefault(ix.tensor, z3.Int(f"value_{ix.tensor}"))
            else:
                value = ix.value
            total = total + k * value
        return total

    left, right = side(e.left), side(e.right)
    return {"lt": left < right, "le": left <= right, "gt": left > right, "ge": left >= right, "eq": left == right,
            "ne": left != right}[e.op]


__all__ = ["condition_formula", "condition_holds"]
