"""A parsed program: its declarations (extents, tensors), its words and its models."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from habu.errors import HabuError, Span, UsageError
from habu.spec.dtypes import DType
from habu.spec.equation import TensorType
from habu.spec.ir import Expr, Extent, Model, TensorDecl

if TYPE_CHECKING:
    from habu.spec.words import Word


@dataclass
class DeclaredExtent:
    extent: Extent
    span: Span


@dataclass
class DeclaredTensor:
    decl: TensorDecl
    span: Span


@dataclass
class Program:
    """Everything a file declares, on top of the prelude's words."""

    extents: dict[str, DeclaredExtent] = field(default_factory=dict)
    tensors: dict[str, DeclaredTensor] = field(default_factory=dict)
    words: dict[str, Word] = field(default_factory=dict)
    models: dict[str, Model] = field(default_factory=dict)
    model_spans: dict[str, Span] = field(default_factory=dict)
    path: str = "<input>"
    # the declared names by lower case, so that the case-insensitive lookups take constant time
    _extents_by_lower: dict[str, list[str]] = field(default_factory=dict, repr=False)
    _tensors_by_lower: dict[str, list[str]] = field(default_factory=dict, repr=False)

    def declare_extent(self, name: str, declared: DeclaredExtent) -> None:
        self.extents[name] = declared
        self._extents_by_lower.setdefault(name.lower(), []).append(name)

    def declare_tensor(self, name: str, declared: DeclaredTensor) -> None:
        self.tensors[name] = declared
        self._tensors_by_lower.setdefault(name.lower(), []).append(name)

    def extents_like(self, name: str) -> list[str]:
        """The declared extents whose names equal `name` but for case."""
        return list(self._extents_by_lower.get(name.lower(), ()))

    # -- lookups shared by equations and words
    def find_tensor(self, name: str) -> DeclaredTensor | None:
        """By exact name, then by a unique case-insensitive match (`x` binds to `X`)."""
        if name in self.tensors:
            return self.tensors[name]
        matches = self._tensors_by_lower.get(name.lower(), [])
        return self.tensors[matches[0]] if len(matches) == 1 else None

    def extent_for_index(self, name: str) -> str | None:
        """The extent an index variable base name ranges over: `m` -> `M`."""
        for ext_name in self._extents_by_lower.get(name.lower(), ()):
            if name == name.lower() or name == ext_name:
                return ext_name
        return None

    def find_word(self, name: str) -> Word | None:
        if name in self.words:
            return self.words[name]
        return self.words.get(name.upper())

    def model(self, name: str) -> Model:
        if name in self.models:
            return self.models[name]
        for n, m in self.models.items():
            if n.lower() == name.lower():
                return m
        known = ", ".join(self.models) or "none"
        raise HabuError(f"no model named {name} in {self.path} (models: {known})")

    def pick(self, name: str | None) -> Model:
        """The model named `name`, or the file's only model when no name is given."""
        if name is not None:
            return self.model(name)
        if len(self.models) == 1:
            return next(iter(self.models.values()))
        if not self.models:
            raise UsageError(f"{self.path} defines no MODEL")
        raise UsageError(f"{self.path} defines several models ({', '.join(self.models)}): pick one with --model")

    def extent_objects(self) -> dict[str, Extent]:
        return {n: d.extent for n, d in self.extents.items()}


class ModelScope:
    """Equation name resolution against a program's declarations."""

    def __init__(self, program: Program):
        self.program = program

    def extent_of_index(self, name: str) -> str | None:
        return self.program.extent_for_index(name)

    def tensor(self, name: str) -> TensorType | None:
        dt = self.program.find_tensor(name)
        if dt is None:
            return None
        d = dt.decl
        return TensorType(d.name, d.name, d.extents, d.range)

    def extent(self, name: str) -> str | None:
        bare = name.lstrip("#")
        return bare if bare in self.program.extents else None

    def extent_size(self, extent: str) -> int | None:
        return self.program.extents[extent].extent.size

    def show_extent(self, extent: str) -> str:
        return f"#{extent}"

    def scalar(self, name: str) -> Expr | None:
        return None


def dtype_of(program: Program, name: str) -> DType | None:
    dt = program.find_tensor(name)
    return dt.decl.dtype if dt else None
