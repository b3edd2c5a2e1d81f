"""The canonical IR: a model is a graph of equation nodes over declared extents and tensors.

Every form of the language (the equation form, word compositions, element-level words) lowers to
this. Nodes are frozen and hashable; `Model.canonical_hash()` does not change with whitespace,
comments, the names of bound index variables, the names of intermediates or of extents — only with
what the model computes and the names of its input and output tensors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TypeVar

from habu.spec.dtypes import DType

INT31_MAX = 2**31 - 1
MAX_EXTENT = 2**40  # a dimension larger than this is certainly a typo
MAX_NESTING = 100  # reductions and gathers inside one another (the walkers recurse through these)
T = TypeVar("T")


# ----------------------------------------------------------------------------- extents and tensors


@dataclass(frozen=True)
class Extent:
    """A dimension type. Static (`size` set) or runtime (`size` None, within lo..hi, a multiple)."""

    name: str  # without the leading '#'
    size: int | None
    lo: int = 1
    hi: int = INT31_MAX
    multiple: int = 1
    # what the source declared, kept when a shape binds the extent (`with_size`): the canonical hash
    # reads it, so a model's hash does not change with the shape a plan is made for
    declared: tuple[int, ...] | None = field(default=None, compare=False)

    @property
    def is_static(self) -> bool:
        return self.size is not None

    def admits(self, n: int) -> bool:
        if self.size is not None:
            return n == self.size
        return self.lo <= n <= self.hi and n % self.multiple == 0

    def with_size(self, n: int) -> Extent:
        return replace(self, size=n, lo=n, hi=n, multiple=1, declared=self.declaration())

    def declaration(self) -> tuple[int, ...]:
        """What the source declares: (size,) for a static extent, (lo, hi, multiple) for a runtime one."""
        if self.declared is not None:
            return self.declared
        return (self.size,) if self.size is not None else (self.lo, self.hi, self.multiple)

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
    values index into (`ITENSOR: IX ( #M #S )` is IX over #M with values in #S). A *grouping*
    (`GROUPS: E ( #R #G )`, `grouped` set) is an index tensor over one extent whose values never
    decrease: the rows of #R come in #G contiguous groups, in order, and a group may be empty."""

    name: str
    extents: tuple[str, ...]
    dtype: DType | None  # None: an intermediate whose storage type the plan chooses
    range: str | None = None
    grouped: bool = False

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
    """An elementwise function applied to its arguments (see `habu.spec.functions`).

    Its hash is computed once, from its arguments' (cached) hashes: hashing a 5,000-term operator
    chain neither recurses nor takes time proportional to its size."""

    fn: str
    args: tuple[Expr, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.fn, self.args)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple:
        return (Op, (self.fn, self.args))  # the hash is recomputed where it is unpickled


@dataclass(frozen=True)
class Reduce:
    """A reduction of `body` over the bound variables `vars` with `op` ('sum' or 'max')."""

    op: str
    vars: tuple[IndexVar, ...]
    body: Expr

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.op, self.vars, self.body)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined]

    def __reduce__(self) -> tuple:
        return (Reduce, (self.op, self.vars, self.body))


@dataclass(frozen=True)
class IndexAffine:
    """An integer combination of index expressions and extent sizes: `i + #J − #I`, `LEN[b]`, `j + 1`."""

    terms: tuple[tuple[int, IndexExpr], ...]  # (coefficient, index expression)
    sizes: tuple[tuple[int, str], ...] = ()  # (coefficient, extent name): `#J`
    const: int = 0

    def index_exprs(self) -> tuple[IndexExpr, ...]:
        return tuple(ix for _, ix in self.terms)


COMPARISONS = {"lt": "<", "le": "≤", "gt": ">", "ge": "≥", "eq": "=", "ne": "≠"}


@dataclass(frozen=True)
class Compare:
    """A condition on indices, `left op right` (op in `COMPARISONS`): as a value, 1 where it holds
    and 0 elsewhere, exactly, in every domain. `where(c, x, y)` selects with it."""

    op: str
    left: IndexAffine
    right: IndexAffine

    def index_exprs(self) -> tuple[IndexExpr, ...]:
        return (*self.left.index_exprs(), *self.right.index_exprs())

    def extents(self) -> tuple[str, ...]:
        return tuple(e for _, e in (*self.left.sizes, *self.right.sizes))

    def map_indices(self, fn: Callable[[IndexExpr], IndexExpr]) -> Compare:
        def side(a: IndexAffine) -> IndexAffine:
            return IndexAffine(tuple((c, fn(ix)) for c, ix in a.terms), a.sizes, a.const)

        return Compare(self.op, side(self.left), side(self.right))

    def map_extents(self, fn: Callable[[str], str]) -> Compare:
        def side(a: IndexAffine) -> IndexAffine:
            return IndexAffine(a.terms, tuple((c, fn(e)) for c, e in a.sizes), a.const)

        return Compare(self.op, side(self.left), side(self.right))


@dataclass(frozen=True)
class NegInf:
    """−∞: in float64 −inf; over GF(p) the identity of the max-reduction model (see field.py), so a
    masked max `max j where(c, x, −∞)` reduces over the unmasked elements only in both domains."""


Expr = Const | Size | Load | Op | Reduce | Compare | NegInf


@dataclass(frozen=True)
class Equation:
    """`target[lhs] = rhs`: defines every element of one tensor.

    A *scatter* (`Y[IX[r] n] += rhs`, `scatter` set) instead adds `rhs` at every point of its domain
    (the variables `lhs`, in order of appearance on the left side) into the element `scatter` names;
    indices that repeat accumulate, and the target keeps its prior contents (it is an input too)."""

    target: str
    lhs: tuple[IndexVar, ...]
    rhs: Expr
    scatter: tuple[IndexExpr, ...] | None = None  # the stored element's indices (None: `lhs` itself)

    @property
    def store_indices(self) -> tuple[IndexExpr, ...]:
        """The indices of the element each point of the domain stores to."""
        return self.scatter if self.scatter is not None else self.lhs


def node_reads(eq: Equation) -> set[str]:
    """The tensors one node reads: its right side's, and for a scatter its target (the prior
    contents it adds to) and the index tensors of its left side."""
    out = tensors_read(eq.rhs)
    if eq.scatter is not None:
        out.add(eq.target)
        for ix in eq.scatter:
            out |= {g.tensor for g in index_subexprs(ix) if isinstance(g, Gather)}
    return out


def scatter_gathers(eq: Equation) -> list[Gather]:
    """The gathers on a scatter's left side (none for an ordinary node)."""
    return [g for ix in eq.scatter or () for g in index_subexprs(ix) if isinstance(g, Gather)]


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
    # the forward model this one is the derived backward of (habu.spec.grad_program.with_backward); None
    # for a model a file defines, whatever its name
    backward_of: str | None = field(default=None, compare=False)

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
        from habu.spec.canonical import canonical_form  # it reads this module's classes

        return canonical_form(self)

    def canonical_hash(self) -> str:
        from habu.spec.canonical import compact_json

        return hashlib.sha256(compact_json(self.canonical()).encode()).hexdigest()


# ----------------------------------------------------------------------------- traversal helpers


def index_subexprs(ix: IndexExpr) -> Iterator[IndexExpr]:
    """`ix` and every index expression inside it, parents first, left to right (iterative)."""
    stack = [ix]
    while stack:
        i = stack.pop()
        yield i
        if isinstance(i, Gather):
            stack.extend(reversed(i.indices))


def children(expr: Expr) -> tuple[Expr, ...]:
    """The value subexpressions of `expr`: an operation's arguments, a reduction's body."""
    if isinstance(expr, Op):
        return expr.args
    if isinstance(expr, Reduce):
        return (expr.body,)
    return ()


def walk(expr: Expr) -> Iterator[Expr]:
    """Every subexpression, parents first, left to right (iterative: chains of any length)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        kids = children(e)
        if kids:
            stack.extend(reversed(kids))


def fold_expr(expr: Expr, visit: Callable[[Expr, list[T]], T]) -> T:
    """Compute bottom-up over all of `expr` without recursion: `visit(e, results of its children)`
    (see `children`). A subexpression shared by several parents is computed once."""
    done: dict[int, T] = {}
    stack: list[tuple[Expr, bool]] = [(expr, False)]
    while stack:
        e, ready = stack.pop()
        key = id(e)
        if key in done:
            continue
        kids = children(e)
        if ready or not kids:
            done[key] = visit(e, [done[id(k)] for k in kids])
        else:
            stack.append((e, True))
            stack.extend((k, False) for k in reversed(kids))
    return done[id(expr)]


def fold_ops(expr: Expr, leaf: Callable[[Expr], T], op: Callable[[Op, list[T]], T], *,
             release: bool = False) -> T:
    """Compute bottom-up over the operations of `expr` without recursion: `leaf(e)` for every other
    node (Const, Size, Load, Reduce) in left-to-right order, `op(e, args)` for an operation once its
    arguments are done. A subexpression shared by several parents is computed once; with `release`,
    a result is dropped as soon as every operation using it has run (for large values, like arrays).
    Reductions are leaves here: a `leaf` that descends into a body recurses only as deep as
    reductions nest (at most `MAX_NESTING` in a checked model)."""
    if not isinstance(expr, Op):
        return leaf(expr)
    uses = _argument_uses(expr) if release else None
    done: dict[int, T] = {}
    stack: list[Expr | None] = [expr]  # None: the operation below it has its arguments done
    while stack:
        e = stack.pop()
        if e is None:
            o = stack.pop()
            assert isinstance(o, Op)
            args = o.args
            done[id(o)] = op(o, [done[id(a)] for a in args])
            if uses is not None:
                for a in args:
                    uses[id(a)] -= 1
                    if not uses[id(a)]:
                        del done[id(a)]
            continue
        if id(e) in done:
            continue
        if isinstance(e, Op):
            stack.append(e)
            stack.append(None)
            stack.extend(reversed(e.args))
        else:
            done[id(e)] = leaf(e)
    return done[id(expr)]


def _argument_uses(expr: Expr) -> dict[int, int]:
    """How many times each node of `expr` is an argument of one of its (distinct) operations."""
    uses: dict[int, int] = {}
    seen: set[int] = set()
    stack = [expr]
    while stack:
        e = stack.pop()
        if not isinstance(e, Op) or id(e) in seen:
            continue
        seen.add(id(e))
        for a in e.args:
            uses[id(a)] = uses.get(id(a), 0) + 1
            stack.append(a)
    return uses


def map_ops(expr: Expr, leaf: Callable[[Expr], Expr]) -> Expr:
    """`expr` with every non-operation node replaced by `leaf(node)`, operations rebuilt (iteratively)."""

    def op(e: Op, args: list[Expr]) -> Expr:
        return e if all(a is b for a, b in zip(args, e.args, strict=True)) else Op(e.fn, tuple(args))

    return fold_ops(expr, leaf, op)


@dataclass(frozen=True)
class ExprSize:
    """How big an expression is as a tree: its node count (a shared subtree counted at each use), its
    height, and how deeply reductions and gathers nest in it."""

    nodes: int
    height: int
    nesting: int


def index_nesting(ix: IndexExpr) -> int:
    """How many gathers nest in `ix` (`IX[IY[m]]` is 2), level by level without recursion."""
    depth, level = 0, [ix]
    while any(isinstance(i, Gather) for i in level):
        depth += 1
        inner = {id(s): s for i in level if isinstance(i, Gather) for s in i.indices}
        level = list(inner.values())
    return depth


def expr_size(expr: Expr) -> ExprSize:
    """The `ExprSize` of `expr`, computed over its shared graph (linear in the distinct nodes)."""

    def visit(e: Expr, kids: list[ExprSize]) -> ExprSize:
        if isinstance(e, Load):
            return ExprSize(1, 1, max((index_nesting(i) for i in e.indices), default=0))
        if isinstance(e, Reduce):
            body = kids[0]
            return ExprSize(body.nodes + 1, body.height + 1, body.nesting + 1)
        if isinstance(e, Op):
            return ExprSize(1 + sum(k.nodes for k in kids), 1 + max(k.height for k in kids),
                            max(k.nesting for k in kids))
        return ExprSize(1, 1, 0)

    return fold_expr(expr, visit)


def loads(expr: Expr) -> Iterator[Load]:
    for e in walk(expr):
        if isinstance(e, Load):
            yield e


def gathers(expr: Expr) -> Iterator[Gather]:
    """Every gather in `expr`: in its loads' indices and in its comparisons."""
    for e in walk(expr):
        if isinstance(e, Load | Compare):
            for ix in (e.indices if isinstance(e, Load) else e.index_exprs()):
                for sub in index_subexprs(ix):
                    if isinstance(sub, Gather):
                        yield sub


def compares(expr: Expr) -> Iterator[Compare]:
    for e in walk(expr):
        if isinstance(e, Compare):
            yield e


def index_free_vars(ix: IndexExpr) -> set[IndexVar]:
    return {sub for sub in index_subexprs(ix) if isinstance(sub, IndexVar)}


def free_vars(expr: Expr) -> set[IndexVar]:
    """The index variables `expr` depends on and does not reduce over (iterative)."""

    def visit(e: Expr, kids: list[frozenset[IndexVar]]) -> frozenset[IndexVar]:
        if isinstance(e, Load):
            return frozenset(v for ix in e.indices for v in index_free_vars(ix))
        if isinstance(e, Compare):
            return frozenset(v for ix in e.index_exprs() for v in index_free_vars(ix))
        if isinstance(e, Reduce):
            return kids[0] - set(e.vars)
        if not kids:
            return frozenset()
        if all(kids[0] >= k for k in kids[1:]):
            return kids[0]
        return frozenset().union(*kids)

    return set(fold_expr(expr, visit))


def tensors_read(expr: Expr) -> set[str]:
    out: set[str] = {ld.tensor for ld in loads(expr)}
    out |= {g.tensor for g in gathers(expr)}
    return out


def rename_vars(expr: Expr, mapping: dict[IndexVar, IndexExpr]) -> Expr:
    """`expr` with index variables replaced (in loads, gathers and reductions' bound variables)."""

    def ix(i: IndexExpr) -> IndexExpr:
        if isinstance(i, IndexVar):
            return mapping.get(i, i)
        if isinstance(i, Gather):
            return Gather(i.tensor, tuple(ix(j) for j in i.indices))
        return i

    def leaf(e: Expr) -> Expr:
        if isinstance(e, Load):
            return Load(e.tensor, tuple(ix(i) for i in e.indices))
        if isinstance(e, Reduce):
            bound = tuple(mapping.get(v, v) for v in e.vars)
            return Reduce(e.op, bound, rename_vars(e.body, mapping))  # type: ignore[arg-type]
        if isinstance(e, Compare):
            return e.map_indices(ix)
        return e

    return map_ops(expr, leaf)
