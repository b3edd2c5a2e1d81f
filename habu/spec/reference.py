"""The reference semantics: every model evaluated in float64 with numpy."""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from habu.spec.evaluate import Evaluator, bind_inputs
from habu.spec.functions import FUNCTIONS
from habu.spec.ir import Model


class Float64:
    """float64 arithmetic: what the golden checks compare a kernel's output against."""

    name = "float64"

    def from_input(self, name: str, data: np.ndarray) -> np.ndarray:
        return np.asarray(data, dtype=np.float64)

    def const(self, value: Fraction) -> np.ndarray:
        return np.asarray(float(value))

    def op(self, fn: str, args: list[np.ndarray]) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.asarray(FUNCTIONS[fn].float64(*args), dtype=np.float64)

    def neg_inf(self) -> np.ndarray:
        return np.asarray(-np.inf)

    def reduce(self, op: str, data: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        return data.sum(axis=axes) if op == "sum" else data.max(axis=axes)

    def repeat_sum(self, data: np.ndarray, count: int) -> np.ndarray:
        return data * float(count)

    def repeat_max(self, data: np.ndarray, count: int) -> np.ndarray:
        return data

    def contract(self, operands: list[np.ndarray], subscripts: str) -> np.ndarray:
        return np.einsum(subscripts, *operands, optimize=True)

    def scatter_add(self, target: np.ndarray, index: tuple[np.ndarray, ...], values: np.ndarray) -> np.ndarray:
        """`target` with `values` added at `index` (repeated indices add every value)."""
        out = np.asarray(target, dtype=np.float64)
        np.add.at(out, index, values)
        return out


def evaluate(model: Model, inputs: dict[str, np.ndarray], sizes: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """The model's outputs in float64, by tensor name."""
    bound = bind_inputs(model, inputs, fixed=sizes)
    return Evaluator(model, bound, Float64()).run(inputs)
