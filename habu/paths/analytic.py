"""What the paths' analytic defaults read of a model at a shape: a node by name, the widest aligned
vector, whether offsets need 64 bits, and each extent's size or multiple. Each path's `default`
(habu/paths/*.py) builds its kernel from these; habu/search/space.py asks the registry for it."""

from __future__ import annotations

from habu.spec.ir import Equation, Model

INT31 = 2**31 - 1


def node_of(model: Model, target: str) -> Equation:
    return next(eq for eq in model.nodes if eq.target == target)


def max_vector(row_elems: int | None, elem_bytes: int, multiple: int = 1, limit_bytes: int = 16) -> int:
    """The widest vector (elements) whose accesses stay aligned: row length and 16 bytes divide it."""
    v = max(1, limit_bytes // elem_bytes)
    while v > 1:
        if row_elems is not None and row_elems % v == 0:
            return v
        if row_elems is None and multiple % v == 0:
            return v
        v //= 2
    return 1


def needs_64bit(model: Model, sizes: dict[str, int]) -> bool:
    """Whether some tensor has more elements than 32-bit offsets reach."""
    for t in (*model.inputs, *model.outputs, *model.intermediates):
        n = 1
        for e in t.extents:
            n *= sizes[e]
        if n > INT31:
            return True
    return False


def index_width(model: Model, sizes: dict[str, int]) -> int:
    return 64 if needs_64bit(model, sizes) else 32


def multiples(model: Model) -> dict[str, int]:
    """Each extent's size, or for a runtime extent the multiple its sizes come in."""
    return {e.name: (e.size if e.size is not None else e.multiple) for e in model.extents}


__all__ = ["index_width", "max_vector", "multiples", "needs_64bit", "node_of"]
