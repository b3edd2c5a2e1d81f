"""A wgmma contraction operand's TMA tensor map, as the lowering gives it: the tensor, its dimensions (innermost
first; TMA's zero fill past them is the access's mask), the box of one load and the swizzle the stage tile is
written in. The wgmma emitter encodes each operand's map from it, and a kernel that warms the plan's next kernel's
boxes (`warm_next`) encodes the very same map of that kernel's operand."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from habu.lower.contraction import tma_box
from habu.lower.layouts import WgmmaOperands
from habu.lower.pipeline import TmaOperandLoad


@dataclass(frozen=True)
class OperandMap:
    tensor: str
    dtype: str
    dims: tuple[str, ...]  # extent names, innermost first
    box: tuple[int, ...]  # innermost first
    swizzle: int  # bytes


def operand_map(lw: Any, ld: TmaOperandLoad) -> OperandMap:
    """The tensor map of the operand that load `ld` of contraction lowering `lw` reads."""
    acc = lw.a if ld.side == "A" else lw.b
    ops = lw.operands  # a K-major tile: the tensor map writes the stage tile's swizzle
    tile = (ops.a_tile if ld.side == "A" else ops.b_tile) if isinstance(ops, WgmmaOperands) else None
    return OperandMap(acc.tensor, acc.dtype, tuple(reversed(acc.bounded_extents())),
                      tma_box(acc, "m" if ld.side == "A" else "n", ld.box_rows, ld.box_k),
                      tile.swizzle if tile else 128)


__all__ = ["OperandMap", "operand_map"]
