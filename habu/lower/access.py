"""Memory accesses of a lowered kernel: which coordinate feeds each index position, the strides,
the masks. Sizes stay symbolic (extent names), so the same access is evaluated with integers by
the finite-field interpreter, with z3 variables by the rule checker, and printed as C by the
emitter.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from habu.spec.ir import IndexConst, IndexExpr, IndexVar, TensorDecl


@dataclass(frozen=True)
class Position:
    """One index position of an access: a kernel axis, a gather through an index tensor, or a constant."""

    kind: str  # "axis", "gather", "const"
    axis: str = ""  # the kernel axis ("m", "n", "k", "r", "c", "e0", ...)
    table: str = ""  # gather: the index tensor, read at [axis]
    value: int = 0  # const


@dataclass(frozen=True)
class IndexCheck:
    """The predicate `0 <= table[axis] < size(extent)`: a gathered (or scattered) position's index value
    lies inside the indexed axis. Part of the access's mask, so an out-of-range index value masks the
    element (a gathered read gives 0, a scattered write does not happen) and raises the kernel's
    sticky error flag instead of reading or writing outside the tensor (docs/ARCHITECTURE.md, "Index
    values")."""

    table: str  # the index tensor
    axis: str  # the kernel axis it is read at
    extent: str  # the extent its values index into (the indexed tensor's dimension)


@dataclass(frozen=True)
class Bound:
    """The predicate `axis < size(extent)` (`<=` only in planted bugs)."""

    axis: str
    extent: str
    inclusive: bool = False


def size_of(token: str, sizes: Mapping[str, Any]) -> Any:
    """An extent's size, or a derived one: "K^8" is #K rounded up to a multiple of 8 (the row
    length of a buffer whose rows start 16 bytes apart); "N/256" is ⌈#N / 256⌉ (the slots of a
    per-tile workspace, one per tile of 256)."""
    if "^" in token:
        name, multiple = token.split("^")
        m = int(multiple)
        return cdiv(sizes[name], m) * m
    if "/" in token:
        name, tile = token.split("/")
        return cdiv(sizes[name], int(tile))
    return sizes[token]


def is_derived(token: str) -> bool:
    """Whether an extent token is a derived size ("K^8", "N/256") rather than an extent's name."""
    return "^" in token or "/" in token


def with_derived(sizes: Mapping[str, int], tokens) -> dict[str, int]:
    """`sizes` plus the derived sizes ("K^8", "N/256") that `tokens` name."""
    out = dict(sizes)
    for t in tokens:
        if is_derived(t) and t not in out:
            out[t] = size_of(t, sizes)
    return out


@dataclass(frozen=True)
class VectorAccess:
    """A vector load or store the kernel makes of a tensor: `elements` consecutive elements at once,
    which needs the tensor's base address aligned to that many elements (the launch checks it)."""

    tensor: str
    elements: int
    why: str


@dataclass(frozen=True)
class Access:
    """A load or store of one tensor inside a kernel."""

    tensor: str
    dtype: str
    extents: tuple[str, ...]
    positions: tuple[Position, ...]
    strides: tuple[tuple[str, ...], ...]  # stride of each position: the product of these extents' sizes
    masks: tuple[Bound, ...]
    checks: tuple[IndexCheck, ...] = ()  # the gathered positions' index values, checked after `masks`

    def numel(self, sizes: Mapping[str, Any]) -> Any:
        n: Any = 1
        for e in self.extents:
            n = n * size_of(e, sizes)
        return n

    def stride(self, pos: int, sizes: Mapping[str, Any]) -> Any:
        s: Any = 1
        for e in self.strides[pos]:
            s = s * size_of(e, sizes)
        return s

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(p.axis for p in self.positions if p.kind in ("axis", "gather"))

    def bounded_extents(self) -> tuple[str, ...]:
        """Per tensor dimension (outermost first), the extent the access stays below: its mask's bound
        where a mask bounds that position's axis, else the tensor's own extent (a staged buffer's
        padded "K^8" without the padding). A TMA tensor map takes these as its global dims, so the
        zeros TMA fills past them are this access's mask: the masked ragged k tail of a TMA operand
        is printed from here, not assumed."""
        out = []
        for ext, p in zip(self.extents, self.positions, strict=True):
            bound = next((b for b in self.masks if p.kind != "const" and b.axis == p.axis), None)
            out.append(bound.extent if bound is not None else ext.split("^")[0])
        return tuple(out)

    def offset(self, coord: Mapping[str, Any], sizes: Mapping[str, Any], arith: IndexArith,
               axes: tuple[str, ...] | None = None) -> Any:
        """The element offset at axis coordinates `coord`, as the kernel computes it: each position's
        value and stride cast to the index width, multiplied, and summed in that width. The one
        definition: the emitter prints it (C text), the finite-field interpreter runs it (wrapping
        int32 arrays). With `axes`, only the terms of positions driven by those axes (a partial offset
        to hoist out of a loop)."""
        total: Any = None
        for pos, p in enumerate(self.positions):
            if axes is not None and (p.kind == "const" or p.axis not in axes):
                continue
            if p.kind == "const":
                if p.value == 0:
                    continue
                value: Any = p.value
            elif p.kind == "axis":
                value = coord[p.axis]
            else:
                value = arith.table(p.table, coord[p.axis])
            stride = self.stride(pos, sizes)
            if isinstance(stride, int) and stride == 1:
                term = arith.cast(value)
            else:
                term = arith.mul(arith.cast(value), arith.cast(stride))
            total = term if total is None else arith.add(total, term)
        return arith.zero() if total is None else total

    def mask(self, coord: Mapping[str, Any], sizes: Mapping[str, Any], arith: IndexArith) -> Any:
        """Whether the access at `coord` is inside the tensor: every bound `axis < size` (`<=` only in
        planted bugs), then every index check `0 <= table[axis] < size` (the table is read only where
        the bounds hold: C's `&&`, the interpreter's `guard`), conjoined. Printed by the emitter and run
        by the interpreter, from this one place."""
        parts = [arith.le(coord[b.axis], size_of(b.extent, sizes)) if b.inclusive
                 else arith.lt(coord[b.axis], size_of(b.extent, sizes)) for b in self.masks]  # (a staged row's "K^8")
        if not self.checks:
            return arith.all(parts)
        inside = arith.all(parts)
        return arith.all([inside] + [arith.index_ok(x.table, coord[x.axis], sizes[x.extent], inside)
                                     for x in self.checks])

    def along(self, axis: str) -> Access:
        """The access with only the bounds and index checks of `axis` (a mask hoisted per row or per k)."""
        return replace(self, masks=tuple(b for b in self.masks if b.axis == axis),
                       checks=tuple(x for x in self.checks if x.axis == axis))


class FlatGrid:
    """A kernel whose blocks each take `per_block` consecutive elements of its output, flattened
    row-major over `extents` (the map and general families)."""

    extents: tuple[str, ...]
    per_block: int

    def numel(self, sizes: Mapping[str, Any]) -> Any:
        n: Any = 1
        for e in self.extents:
            n = n * sizes[e]
        return n

    def grid(self, sizes: Mapping[str, Any]) -> Any:
        """Blocks launched: one per `per_block` elements (ints, z3 terms or C expressions)."""
        return cdiv(self.numel(sizes), self.per_block)

    def decode(self) -> tuple[tuple[str, str, str, str], ...]:
        """How flat element `e` becomes the output's coordinates, row-major, as (target, source, op,
        extent) steps: for i > 0 from the innermost, e{i} = rest % #E_i and q{i} = rest / #E_i (rest:
        `e`, then the q before); last e0 = rest ("=", unreduced: an index past the last element fails
        e0 < #E0). The map kernel prints each step as a line, `coordinates` executes them."""
        steps: list[tuple[str, str, str, str]] = []
        rest = "e"
        for i in reversed(range(1, len(self.extents))):
            steps += [(f"e{i}", rest, "%", self.extents[i]), (f"q{i}", rest, "/", self.extents[i])]
            rest = f"q{i}"
        return (*steps, ("e0", rest, "=", self.extents[0])) if self.extents else ()

    def coordinates(self, flat: Any, sizes: Mapping[str, Any]) -> dict[str, Any]:
        """The output coordinates e0, e1, ... of flat element `flat` (ints, arrays or C expressions):
        the `decode` steps, executed."""
        env: dict[str, Any] = {"e": flat}
        for target, source, op, extent in self.decode():
            v = env[source]
            env[target] = v % sizes[extent] if op == "%" else v // sizes[extent] if op == "/" else v
        return {a: v for a, v in env.items() if a.startswith("e") and a != "e"}


class IndexArith(Protocol):
    """The integer arithmetic an access's offset and mask are evaluated in: C text for the emitter
    (`habu.emit_cuda.common.CIndex`), wrapping numpy arrays for the interpreter (`habu.prove.interp`)."""

    def cast(self, x: Any) -> Any: ...  # a value in the kernel's index type (int32 wraps)
    def mul(self, a: Any, b: Any) -> Any: ...
    def add(self, a: Any, b: Any) -> Any: ...
    def zero(self) -> Any: ...
    def table(self, name: str, coordinate: Any) -> Any: ...  # an index tensor's value at a coordinate
    def lt(self, a: Any, b: Any) -> Any: ...
    def le(self, a: Any, b: Any) -> Any: ...
    def all(self, parts: list[Any]) -> Any: ...
    # whether the index tensor's value at `coordinate` is in 0..size-1, where `guard` holds (the table is
    # not read elsewhere); a value outside raises the kernel's error flag (C) or is recorded (interpreter)
    def index_ok(self, name: str, coordinate: Any, size: Any, guard: Any) -> Any: ...


def row_major_strides(extents: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(extents[i + 1 :]) for i in range(len(extents)))


def access_for(decl: TensorDecl, indices: tuple[IndexExpr, ...], axis_of: Mapping[IndexVar, str],
               extent_of_axis: Mapping[str, str], storage: Mapping[str, str] | None = None) -> Access:
    """The access of `decl[indices]`, where each index variable maps to a kernel axis."""
    from habu.spec.ir import Gather

    positions: list[Position] = []
    masks: list[Bound] = []
    checks: list[IndexCheck] = []
    for dim, ix in enumerate(indices):
        if isinstance(ix, IndexVar):
            axis = axis_of[ix]
            positions.append(Position("axis", axis))
        elif isinstance(ix, IndexConst):
            positions.append(Position("const", value=ix.value))
            continue
        elif isinstance(ix, Gather) and len(ix.indices) == 1 and isinstance(ix.indices[0], IndexVar):
            axis = axis_of[ix.indices[0]]
            positions.append(Position("gather", axis, table=ix.tensor))
            check = IndexCheck(ix.tensor, axis, decl.extents[dim])
            if check not in checks:
                checks.append(check)
        else:
            raise NotImplementedError(f"access {decl.name}[...] with index {ix} is not lowered yet")
        bound = Bound(axis, extent_of_axis[axis])
        if bound not in masks:
            masks.append(bound)
    dtype = decl.dtype.name if decl.dtype else (storage or {}).get(decl.name, "f32")
    return Access(decl.name, dtype, decl.extents, tuple(positions),
                  row_major_strides(decl.extents), tuple(masks), tuple(checks))


def _concrete(x: Any) -> bool:
    import numpy as np

    return isinstance(x, int | np.integer | np.ndarray)


def cdiv(a: Any, b: Any) -> Any:
    """Ceiling division for ints, numpy arrays and z3 integer expressions alike (b > 0)."""
    if _concrete(a) and _concrete(b):
        return -(-a // b)
    return (a + b - 1) / b  # z3: integer division on Int sorts


def floordiv(a: Any, b: Any) -> Any:
    if _concrete(a) and _concrete(b):
        return a // b
    return a / b


def minimum(a: Any, b: Any) -> Any:
    import numpy as np

    if hasattr(a, "__habu_min__"):
        return a.__habu_min__(b)
    if hasattr(b, "__habu_min__"):
        return b.__habu_min__(a)
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    if _concrete(a) and _concrete(b):
        return np.minimum(a, b)
    import z3

    return z3.If(a < b, a, b)


def maximum(a: Any, b: Any) -> Any:
    """The larger of two ints, numpy arrays, z3 integers or C expressions (`CExpr.__habu_max__`)."""
    import numpy as np

    if hasattr(a, "__habu_max__"):
        return a.__habu_max__(b)
    if hasattr(b, "__habu_max__"):
        return b.__habu_max__(a)
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if _concrete(a) and _concrete(b):
        return np.maximum(a, b)
    import z3

    return z3.If(a < b, b, a)
