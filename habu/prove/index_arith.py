"""Index arithmetic as a kernel does it: int64 arrays that wrap at the kernel's index width, index tables read
where a mask holds (`NumpyIndex`, the arithmetic `Access.offset` and `Access.mask` run on in the finite-field
interpreter, habu/prove/interp.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from habu.prove.interp import Memory


def wrap(x: np.ndarray, width: int) -> np.ndarray:
    """Two's-complement wrap-around of int64 values to `width` bits."""
    if width >= 64:
        return x
    shift = np.int64(64 - width)  # the low `width` bits, sign-extended (numpy's shifts on int64 wrap)
    return (np.asarray(x, dtype=np.int64) << shift) >> shift


def computing(where, bad: np.ndarray) -> str:
    """A fault message's prefix naming the element the faulty lanes `bad` compute (`where`: the kernel's namer)."""
    return f"while computing {where(bad)}, " if where is not None else ""


class NumpyIndex:
    """Index arithmetic on int64 arrays that wrap at the kernel's index width, as the GPU's do, for
    `Access.offset` and `Access.mask` (the definitions the emitter prints). A gather reads the index
    tensor only where the access's mask holds, and faults when an index lies outside it."""

    def __init__(self, width: int, mem: Memory, kernel: str, mask: np.ndarray | None = None, where=None):
        self.width, self.mem, self.kernel, self.mask, self.where = width, mem, kernel, mask, where

    def cast(self, x: Any) -> np.ndarray:
        return wrap(np.asarray(x, dtype=np.int64), self.width)

    def mul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return wrap(a * b, self.width)

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return wrap(a + b, self.width)

    def zero(self) -> np.ndarray:
        return np.zeros((), dtype=np.int64)

    def table(self, name: str, coordinate: Any) -> np.ndarray:
        """The table's values at `coordinate`, read where the mask holds (0 where a read would leave the table,
        a fault). Each coordinate is read once: where the mask is wider than the coordinates (a gathered row
        index beside a loop over the row's columns), a coordinate is read if any lane reading it is unmasked,
        and the values are broadcast to the lanes (a masked lane's value is never used)."""
        t = np.asarray(coordinate, dtype=np.int64)
        mask = np.asarray(self.mask if self.mask is not None else np.ones((), bool))
        shape = np.broadcast_shapes(t.shape, mask.shape)
        t_mask = _collapse(np.broadcast_to(mask, shape), t.shape)
        table = self.mem.table(name)
        safe = np.where(t_mask, t, 0)
        outside = t_mask & ((safe < 0) | (safe >= table.numel))
        if np.any(outside):
            o = int(safe[outside].flat[0])
            self.mem.fault(f"{computing(self.where, np.broadcast_to(outside, shape))}{self.kernel} reads index "
                           f"tensor {name} out of bounds (at {o}, outside 0..{table.numel - 1})")
        return np.broadcast_to(np.where(outside, 0, table.at(np.where(outside, 0, safe))), shape)

    def index_ok(self, name: str, coordinate: Any, size: Any, guard: Any) -> np.ndarray:
        """The kernel's `habu::index_ok`: the table is read where `guard` holds; a value outside
        0..size-1 is masked and recorded in the memory's index errors (the kernel's error words)."""
        t = np.asarray(coordinate, dtype=np.int64)
        g = np.broadcast_to(np.asarray(guard, dtype=bool), np.broadcast_shapes(t.shape, np.shape(guard)))
        values = NumpyIndex(self.width, self.mem, self.kernel, g, self.where).table(name, t)
        ok = (values >= 0) & (values < size)
        bad = g & ~ok
        if np.any(bad):
            self.mem.index_error(self.kernel, name, np.broadcast_to(t, bad.shape)[bad], values[bad])
        return g & ok

    def lt(self, a: Any, b: Any) -> np.ndarray:
        return np.asarray(a) < b

    def le(self, a: Any, b: Any) -> np.ndarray:
        return np.asarray(a) <= b

    def all(self, parts: list[np.ndarray]) -> np.ndarray:
        out = np.ones((), dtype=bool)
        for p in parts:
            out = out & p
        return out


def _collapse(mask: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`mask` (of a shape `shape` broadcasts to) reduced by any() over the axes `shape` broadcasts along."""
    lead = mask.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, n in enumerate(shape) if n == 1 and mask.shape[lead + i] != 1)
    return mask.any(axis=axes).reshape(shape) if axes else mask
