"""How each kernel kind launches, registered by the kind's emitter module.

`CudaKernel.grid` (concrete sizes, habu/emit_cuda/kernel.py) and the standalone export's grid formulas
and SLOTS rule (habu/emit_cuda/standalone.py) ask `geometry_for(lowering)` instead of telling kinds
apart. Each emitter module calls `register_geometry` for the lowering types it prints (emit_fma.py for
the contraction emitters, emit_rows.py, emit_map.py, emit_general.py, emit_columns.py, emit_stage.py),
and habu/emit_cuda/__init__.py imports them all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from habu.emit_cuda.cexpr import CExpr, c

Grid = tuple[Any, Any, Any]


def cmax(a: Any, b: Any) -> Any:
    """max of two grid terms: a number when both are, else a C expression."""
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return CExpr(f"max((long long)({c(a)}), (long long)({c(b)}))")


def _no_slots(lw: Any, cluster: int) -> str | None:
    return None


@dataclass(frozen=True)
class LaunchGeometry:
    """One kernel kind's launch.

    blocks: `(lw, sizes, slots) -> (x, y, z)` blocks for concrete sizes (`slots`: the blocks resident
        at once, for a persistent grid).
    formula: `(lw, sizes, SLOTS) -> (x, y, z)` the same as C expressions of symbolic sizes (the
        standalone export's grid; a term may be a number, a CExpr or a literal string).
    slots: `(lw, cluster) -> rule` how SLOTS is found on the device, None when the grid does not use it.
    """

    blocks: Callable[[Any, Mapping[str, int], int], tuple[int, int, int]]
    formula: Callable[[Any, Mapping[str, Any], CExpr], Grid]
    slots: Callable[[Any, int], str | None] = _no_slots


# a grid of ⌈numel / per block⌉ blocks along x (map and general kernels: `lw.grid(sizes)`)
FLAT_GRID = LaunchGeometry(
    blocks=lambda lw, sizes, slots: (max(1, int(lw.grid(sizes))), 1, 1),
    formula=lambda lw, s, slots: (cmax(1, lw.grid(s)), "1", "1"))



def _blocks_2d(lw: Any, sizes: Mapping[str, int], slots: int) -> tuple[int, int, int]:
    x, y = lw.grid(sizes)
    return (max(1, int(x)), max(1, int(y)), 1)


def _formula_2d(lw: Any, s: Mapping[str, Any], slots: CExpr) -> Grid:
    x, y = lw.grid(s)
    return (cmax(1, x), cmax(1, y), "1")


# a 2-D grid, `lw.grid(sizes)` = (x, y) (column kernels: tiles × row splits)
GRID_2D = LaunchGeometry(blocks=_blocks_2d, formula=_formula_2d)

_GEOMETRY: dict[type, LaunchGeometry] = {}


def register_geometry(lowering_type: type, geometry: LaunchGeometry) -> None:
    """Called once by the emitter module that prints kernels of `lowering_type`."""
    _GEOMETRY[lowering_type] = geometry


def geometry_for(lw: Any) -> LaunchGeometry:
    """The registered launch geometry of a lowering's kind."""
    geometry = next((_GEOMETRY[t] for t in type(lw).__mro__ if t in _GEOMETRY), None)  # a subclass is its base's kind
    if geometry is None:
        raise TypeError(f"no launch geometry is registered for {type(lw).__name__} "
                        "(its emitter module calls habu.emit_cuda.geometry.register_geometry)")
    return geometry
