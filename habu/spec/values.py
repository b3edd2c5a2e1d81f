"""The values a word sequence works on: whole tensors, element values, indices."""

from __future__ import annotations

from dataclasses import dataclass

from habu.spec.dtypes import DType
from habu.spec.ir import Expr, IndexExpr
from habu.spec.lexer import Token


@dataclass(frozen=True)
class Value:
    origin: Token  # where it was pushed, for messages

    def describe(self) -> str:  # pragma: no cover - overridden
        return "a value"


@dataclass(frozen=True)
class TensorValue(Value):
    """A whole tensor: a declared one, or the result of a word (an intermediate)."""

    tensor: str
    extents: tuple[str, ...]
    dtype: DType | None
    label: str

    def describe(self) -> str:
        shape = " ".join(f"#{e}" for e in self.extents)
        return f"{self.label} ( {shape} )"


@dataclass(frozen=True)
class ScalarValue(Value):
    """An element value `r`: an expression over index variables (or a constant)."""

    expr: Expr

    def describe(self) -> str:
        from habu.spec.equation import format_expr

        return f"the element value {shorten(format_expr(self.expr))}"


SHOWN_VALUE = 80  # characters of a value's expression that an error message shows


def shorten(text: str) -> str:
    return text if len(text) <= SHOWN_VALUE else text[: SHOWN_VALUE - 1] + "…"


@dataclass(frozen=True)
class IndexValue(Value):
    """An index `ix<#M>`: an index variable, or an index read from an index tensor."""

    expr: IndexExpr
    extent: str

    def describe(self) -> str:
        from habu.spec.equation import format_index

        return f"the index {shorten(format_index(self.expr))} ix<#{self.extent}>"


@dataclass(frozen=True)
class LaneValue(Value):
    """`g`: the global lane index of an element-wise kernel (each lane handles its elements)."""

    def describe(self) -> str:
        return "the lane index g"


@dataclass(frozen=True)
class UnknownValue(Value):
    """A placeholder while a definition's body is checked before it is used."""

    label: str = "an input"

    def describe(self) -> str:
        return self.label
