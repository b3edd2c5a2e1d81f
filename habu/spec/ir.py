"""The canonical IR: a model is a graph of equation nodes over declared extents and tensors.

Every form of the language (the equation form, word compositions, element-level words) lowers to
this. Nodes are frozen and hashable; `Model.canonical_hash()` does not change with whitespace,
comments, the names of bound index variables, the names of intermediates or of extents — only with
what the model computes and the names of its input and output tensors.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from fractions import Fraction

from habu.spec.dtypes import DType

INT31_MAX = 2**31 - 1
MAX_EXTENT = 2**40  # a dimension larger than this is certainly a typo


# ----------------------------------------------------------------------------- extents and tensors


@dataclass(frozen=True)
class Extent:
    """A dimension type. Static (`size` set) or runtime (`size` None, within lo..hi, a multiple)."""

    name: str  # without the leading '#'
    size: int | None
    lo: int = 1
    hi: int = INT31_MAX
    multiple: int = 1

    @property
    def is_static(self) -> bool:
        return self.size is not None

    def admits(self, n: int) -> bool:
        if self.size is not None:
            return n == self.size
        return self.lo <= n <= self.hi and n % self.multiple == 0

    def with_size(self, n: int) -> Extent:
        return replace(self, size=n, lo=n, hi=n, multiple=1)

    def describe(self) -> str:
        if self.size is not None:
            return f"#{self.name} = {self.size}"
        text = f"#{self.name} in {self.lo}..{self.hi}"
        if self.multiple > 1:
            text += f", multiple of {self.multiple}"
        return text + " (runtime)"

    def bound_text(self) -> str:
        return str(self.size) if self.size is not None else f"{self.lo}..{self.hi}" + (
            f"%{self.multiple}" if self.multiple > 1 else "")


@dataclass(frozen=True)
class TensorDecl:
    """A declared tensor. For an index tensor, `extents` is its domain and `range` the extent its
    values index into (`ITENSOR: IX ( #M #S )` is IX over #M with values in #S)."""

    name: str
    extents: tuple[str, ...]
    dtype: DType | None  # None: an intermediate whose storage type the plan chooses
    range: str | None = None

    @property
    def is_index(self) -> bool:
        return self.range is not None

    @property
    def rank(self) -> int:
        return len(self.extents)


# ----------------------------------------------------------------------------- index expressions


@dataclass(frozen=True)
class IndexVar:
    """An index variable ranging over an extent."""

    name: str
    extent: str


@dataclass(frozen=True)
class IndexConst:
    """A fixed index (0 into a size-1 extent, for broadcasts)."""

    value: int


@dataclass(frozen=True)
class Gather:
    """An index read from an index tensor: `IX[m]`."""

    tensor: str
    indices: tuple[IndexExpr, ...]


IndexExpr = IndexVar | IndexConst | Gather


# ----------------------------------------------------------------------------- value expressions


@dataclass(frozen=True)
class Const:
    """An exact rational constant (a float literal is kept as its exact binary value)."""

    value: Fraction


@dataclass(frozen=True)
class Size:
    """The size of an extent, as a number."""

    extent: str


@dataclass(frozen=True)
class Load:
    """An element of a tensor."""

    tensor: str
    indices: tuple[IndexExpr, ...]


@dataclass(frozen=True)
class Op:
    """An elementwise function applied to its arguments (see `habu.spec.functions`)."""

    fn: str
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Reduce:
    """A reduction of `body` over the bound variables `vars` with `op` ('sum' or 'max')."""

    op: str
    vars: tuple[IndexVar, ...]
    body: Expr


Expr = Const | Size | Load | Op | Reduce


@dataclass(frozen=True)
class Equation:
    """`target[lhs] = rhs`: defines every element of one tensor."""

    target: str
    lhs: tuple[IndexVar, ...]
    rhs: Expr


@dataclass(frozen=True)
class Obligation:
    """A fact about the inputs that the model needs and that later stages prove or check at run time."""

    kind: str  # "index-range", "divisible", ...
    text: str
    tensor: str | None = None
    extent: str | None = None
    value: int | None = None


# ----------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class Model:
    """A named model: inputs, outputs, intermediates and the equations that define them."""

    name: str
    form: str  # "equation" or "composition"
    extents: tuple[Extent, ...]
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    intermediates: tuple[TensorDecl, ...]
    nodes: tuple[Equation, ...]
    obligations: tuple[Obligation, ...] = ()
    words: tuple[str, ...] = field(default=(), compare=False)  # the composition's words, for reports

    # -- lookups
    def extent(self, name: str) -> Extent:
        for e in self.extents:
            if e.name == name:
                return e
        raise KeyError(name)

    def tensor(self, name: str) -> TensorDecl:
        for t in (*self.inputs, *self.outputs, *self.intermediates):
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def sizes(self) -> dict[str, int | None]:
        return {e.name: e.size for e in self.extents}

    @property
    def runtime_extents(self) -> tuple[Extent, ...]:
        return tuple(e for e in self.extents if not e.is_static)

    def with_sizes(self, sizes: dict[str, int]) -> Model:
        """The model with some extents fixed to sizes (runtime extents, or overriding static ones)."""
        new = []
        for e in self.extents:
            if e.name in sizes:
                new.append(e.with_size(sizes[e.name]))
            else:
                new.append(e)
        return replace(self, extents=tuple(new))

    # -- canonical form
    def canonical(self) -> dict:
        return canonical_form(self)

    def canonical_hash(self) -> str:
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


# ----------------------------------------------------------------------------- traversal helpers


def index_subexprs(ix: IndexExpr) -> Iterator[IndexExpr]:
    yield ix
    if isinstance(ix, Gather):
        for sub in ix.indices:
            yield from index_subexprs(sub)


def walk(expr: Expr) -> Iterator[Expr]:
    """Every subexpression, parents first."""
    yield expr
    if isinstance(expr, Op):
        for a in expr.args:
            yield from walk(a)
    elif isinstance(expr, Reduce):
        yield from walk(expr.body)


def loads(expr: Expr) -> Iterator[Load]:
    for e in walk(expr):
        if isinstance(e, Load):
            yield e


def gathers(expr: Expr) -> Iterator[Gather]:
    for ld in loads(expr):
        for ix in ld.indices:
            for sub in index_subexprs(ix):
                if isinstance(sub, Gather):
                    yield sub


def index_free_vars(ix: IndexExpr) -> set[IndexVar]:
    if isinstance(ix, IndexVar):
        return {ix}
    if isinstance(ix, Gather):
        out: set[IndexVar] = set()
        for sub in ix.indices:
            out |= index_free_vars(sub)
        return out
    return set()


def free_vars(expr: Expr) -> set[IndexVar]:
    if isinstance(expr, Load):
        out: set[IndexVar] = set()
        for ix in expr.indices:
            out |= index_free_vars(ix)
        return out
    if isinstance(expr, Op):
        out = set()
        for a in expr.args:
            out |= free_vars(a)
        return out
    if isinstance(expr, Reduce):
        return free_vars(expr.body) - set(expr.vars)
    return set()


def tensors_read(expr: Expr) -> set[str]:
    out: set[str] = set()
    for ld in loads(expr):
        out.add(ld.tensor)
        for ix in ld.indices:
            for sub in index_subexprs(ix):
                if isinstance(sub, Gather):
                    out.add(sub.tensor)
    return out


def rename_vars(expr: Expr, mapping: dict[IndexVar, IndexExpr]) -> Expr:
    """`expr` with index variables replaced (in loads, gathers and reductions' bound variables)."""

    def ix(i: IndexExpr) -> IndexExpr:
        if isinstance(i, IndexVar):
            return mapping.get(i, i)
        if isinstance(i, Gather):
            return Gather(i.tensor, tuple(ix(j) for j in i.indices))
        return i

    if isinstance(expr, Load):
        return Load(expr.tensor, tuple(ix(i) for i in expr.indices))
    if isinstance(expr, Op):
        return Op(expr.fn, tuple(rename_vars(a, mapping) for a in expr.args))
    if isinstance(expr, Reduce):
        bound = tuple(mapping.get(v, v) for v in expr.vars)
        return Reduce(expr.op, bound, rename_vars(expr.body, mapping))  # type: ignore[arg-type]
    return expr


# ----------------------------------------------------------------------------- canonicalisation


class _Namer:
    def __init__(self, prefix: str):
        self.prefix = prefix
        self.names: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name not in self.names:
            self.names[name] = f"{self.prefix}{len(self.names)}"
        return self.names[name]


def canonical_form(model: Model) -> dict:
    """A JSON-able form with every incidental name replaced by its order of first appearance."""
    ext = _Namer("e")
    interface = {t.name for t in (*model.inputs, *model.outputs)}
    tens = _Namer("%")

    def tname(name: str) -> str:
        return name if name in interface else tens(name)

    def decl(t: TensorDecl) -> list:
        return [tname(t.name), [ext(e) for e in t.extents], t.dtype.name if t.dtype else None,
                ext(t.range) if t.range else None]

    def node(eq: Equation) -> list:
        var = _Namer("v")

        def ix(i: IndexExpr) -> list:
            if isinstance(i, IndexVar):
                return ["var", var(i.name), ext(i.extent)]
            if isinstance(i, IndexConst):
                return ["const", i.value]
            return ["gather", tname(i.tensor), [ix(s) for s in i.indices]]

        def ex(e: Expr) -> list:
            if isinstance(e, Const):
                return ["const", str(e.value)]
            if isinstance(e, Size):
                return ["size", ext(e.extent)]
            if isinstance(e, Load):
                return ["load", tname(e.tensor), [ix(i) for i in e.indices]]
            if isinstance(e, Op):
                return ["op", e.fn, [ex(a) for a in e.args]]
            bound = [[var(v.name), ext(v.extent)] for v in e.vars]
            return ["reduce", e.op, bound, ex(e.body)]

        lhs = [[var(v.name), ext(v.extent)] for v in eq.lhs]
        return [tname(eq.target), lhs, ex(eq.rhs)]

    nodes = [node(eq) for eq in model.nodes]
    return {
        "inputs": [decl(t) for t in model.inputs],
        "outputs": [decl(t) for t in model.outputs],
        "intermediates": [decl(t) for t in model.intermediates],
        "nodes": nodes,
    }
