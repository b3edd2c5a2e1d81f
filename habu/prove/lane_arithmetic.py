"""The field as the kernels' lanes compute in it (the finite-field interpreter's arithmetic)."""

from __future__ import annotations

import numpy as np

from habu.spec.field import PrimeField


class LaneArithmetic:
    """A field as the kernels' lanes compute in it: a division by zero is 0 instead of an error. A lane that
    divides by a masked load's zero (the rows of a last tile past #M, read as 0: `O[m n] = (Σ k …) / S[m]`)
    computes a value the kernel never stores; the float kernel gets inf there. The reference keeps the
    field's own division (a zero divisor there happens with probability about 1/p), so a lane that divides
    by zero and stores the result still differs from it: the comparison, not an error, reports it."""

    def __init__(self, field: PrimeField):
        self._field = field

    def __getattr__(self, name: str):
        return getattr(self._field, name)

    def op(self, fn: str, args: list[np.ndarray]) -> np.ndarray:
        return self._field.op("div0" if fn == "div" else fn, args)


__all__ = ["LaneArithmetic"]
