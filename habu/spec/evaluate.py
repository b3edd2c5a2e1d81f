"""Evaluating a model's equations over a number domain: float64 (the reference) or GF(p).

One walker serves both domains. An expression evaluates to a *labelled array*: data whose axes are
named by index variables. Loads through plain index variables are views; gathers use advanced
indexing; a sum over a product of factors is a contraction (einsum / BLAS), so a 4096³ GEMM
reference costs one matrix product, not a 4096³ temporary.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

import numpy as np

from habu.errors import HabuError
from habu.spec.ir import (
    Compare,
    Const,
    Equation,
    Expr,
    Gather,
    IndexAffine,
    IndexConst,
    IndexExpr,
    IndexVar,
    Load,
    Model,
    NegInf,
    Op,
    Reduce,
    Size,
    fold_ops,
    index_subexprs,
)

# the most values a gathered factor of a contraction holds at once (`Evaluator._sliced`): 2^24
SLICE_ELEMENTS = 1 << 24


class EvalError(HabuError):
    """The inputs break an obligation of the model (an index out of range, a division by zero)."""


class Domain(Protocol):
    """The arithmetic an evaluation runs in."""

    name: str

    def from_input(self, name: str, data: np.ndarray) -> np.ndarray: ...
    def const(self, value: Fraction) -> np.ndarray: ...
    def neg_inf(self) -> np.ndarray: ...
    def op(self, fn: str, args: list[np.ndarray]) -> np.ndarray: ...
    def reduce(self, op: str, data: np.ndarray, axes: tuple[int, ...]) -> np.ndarray: ...
    def repeat_sum(self, data: np.ndarray, count: int) -> np.ndarray: ...
    def repeat_max(self, data: np.ndarray, count: int) -> np.ndarray: ...
    def contract(self, operands: list[np.ndarray], subscripts: str) -> np.ndarray: ...
    def scatter_add(self, target: np.ndarray, index: tuple[np.ndarray, ...], values: np.ndarray) -> np.ndarray: ...


@dataclass
class Labelled:
    data: np.ndarray
    labels: tuple[IndexVar, ...]


def _align(x: Labelled, labels: tuple[IndexVar, ...]) -> np.ndarray:
    """x's data with its axes ordered as `labels` (size-1 axes where x does not vary)."""
    order = [x.labels.index(v) for v in labels if v in x.labels]
    data = np.transpose(x.data, order) if order != list(range(len(order))) else x.data
    shape = []
    it = iter(data.shape)
    for v in labels:
        shape.append(next(it) if v in x.labels else 1)
    return data.reshape(shape)


def _union(*groups: tuple[IndexVar, ...]) -> tuple[IndexVar, ...]:
    out: list[IndexVar] = []
    for g in groups:
        for v in g:
            if v not in out:
                out.append(v)
    return tuple(out)


class BoxTensor:
    """A tensor known only on a box: a set of indices per dimension (the elements a check needs).

    Indexing it like an array with integer arrays of global indices reads those elements; reading
    outside the box is an error (the demand analysis forgot an element)."""

    def __init__(self, data: np.ndarray, coords: tuple[np.ndarray, ...], full_shape: tuple[int, ...]):
        self.data = data
        self.coords = coords
        self.shape = full_shape
        # per dimension, the box's indices sorted and where each sits in the box: a lookup that
        # needs memory for the box only, not for the whole extent (#N = 2^31 needed 16 GiB)
        self._sorted: list[tuple[np.ndarray, np.ndarray]] = []
        for c in coords:
            c = np.asarray(c, dtype=np.int64)
            order = np.argsort(c, kind="stable")
            self._sorted.append((c[order], order))

    def __getitem__(self, idx: tuple) -> np.ndarray:
        local = []
        for (keys, order), i in zip(self._sorted, idx, strict=True):
            i = np.asarray(i)
            pos = np.minimum(np.searchsorted(keys, i), max(len(keys) - 1, 0))
            if len(keys) == 0 or np.any(keys[pos] != i):
                raise KeyError("read outside the evaluated box")
            local.append(order[pos])
        return self.data[tuple(local)]


def check_grouped(name: str, values: np.ndarray) -> None:
    """A grouping's values never decrease (`GROUPS:`): the rows of each group are contiguous, in order."""
    v = np.asarray(values).ravel()
    down = np.flatnonzero(v[1:] < v[:-1])
    if len(down):
        r = int(down[0]) + 1
        raise EvalError(f"{name} is a grouping (GROUPS:) and its values never decrease, but {name}[{r}] = "
                        f"{int(v[r])} follows {name}[{r - 1}] = {int(v[r - 1])}",
                        notes=("sort the rows by group (a stable argsort of the group of each row)",))


class Evaluator:
    """Evaluates a model's nodes in order over one domain.

    `boxes` restricts a node to some indices per dimension of its target (a BoxTensor results);
    inputs may be arrays or lazily computed tensors that support integer-array indexing."""

    def __init__(self, model: Model, sizes: dict[str, int], domain: Domain,
                 boxes: dict[str, tuple[np.ndarray, ...]] | None = None):
        self.model = model
        self.sizes = sizes
        self.domain = domain
        self.env: dict[str, np.ndarray] = {}
        self.index_env: dict[str, np.ndarray] = {}
        self.boxes = boxes or {}
        self.var_values: dict[IndexVar, np.ndarray] = {}

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        for t in self.model.inputs:
            data = inputs[t.name]
            lazy = not isinstance(data, np.ndarray | int | float | list)
            if t.is_index:
                self.index_env[t.name] = data if lazy else np.asarray(data, dtype=np.int64)
                if t.grouped and not lazy:
                    check_grouped(t.name, self.index_env[t.name])
            else:
                self.env[t.name] = data if lazy else self.domain.from_input(t.name, data)
        for eq in self.model.nodes:
            if self.boxes and eq.target not in self.boxes:
                continue  # no checked element depends on it
            self.env[eq.target] = self.node(eq)
        return {t.name: self.env[t.name] for t in self.model.outputs if t.name in self.env}

    def node(self, eq: Equation):
        if eq.scatter is not None:
            return self.scatter(eq)
        box = self.boxes.get(eq.target)
        self.var_values = {v: box[i] for i, v in enumerate(eq.lhs)} if box is not None else {}
        val = self.expr(eq.rhs)
        data = _align(val, eq.lhs)
        full = tuple(self.sizes[v.extent] for v in eq.lhs)
        if box is None:
            # (a copy, not np.ascontiguousarray: that makes a scalar's 0-d value an array of one element, which
            # a contraction reading the scalar then took for an axis; found by a fuzz of backward models)
            return np.broadcast_to(data, full).copy()
        shape = tuple(len(c) for c in box)
        return BoxTensor(np.broadcast_to(data, shape).copy(), box, full)

    def scatter(self, eq: Equation):
        """`T[IX[r] n] += rhs`: the target's prior contents plus, at every point of the domain, `rhs`
        added at the element the left side names (duplicates accumulate, as `np.add.at`). With a box
        for the target, the domain is restricted along the positions indexed by a plain variable (the
        box's coordinates there) and runs in full along gathered ones (any point may land in the box);
        values landing outside the box are dropped."""
        assert eq.scatter is not None
        box = self.boxes.get(eq.target)
        self.var_values = {}
        if box is not None:
            for pos, ix in enumerate(eq.scatter):
                if isinstance(ix, IndexVar):
                    self.var_values[ix] = np.asarray(box[pos], dtype=np.int64)
        domain = tuple(len(self.var_values[v]) if v in self.var_values else self.sizes[v.extent] for v in eq.lhs)
        values = np.broadcast_to(_align(self.expr(eq.rhs), eq.lhs), domain)
        index = [np.broadcast_to(_align(self.index(ix), eq.lhs), domain) for ix in eq.scatter]
        prior = self.env[eq.target]
        full = tuple(self.sizes[e] for e in self.model.tensor(eq.target).extents)
        if box is None:
            if not isinstance(prior, np.ndarray):  # a lazily drawn input (the field check's virtual tensors)
                prior = self.domain.from_input(eq.target, prior.materialize())
            return self.domain.scatter_add(np.array(prior, copy=True), tuple(index), values)
        local, inside = [], np.ones((1,) * len(domain), dtype=bool)
        for ix, coords in zip(eq.scatter, box, strict=True):  # global indices to places in the box
            if isinstance(ix, IndexVar) and list(eq.scatter).count(ix) == 1:
                # the variable runs over the box's own coordinates (var_values above): place i is the i-th
                local.append(_align(Labelled(np.arange(len(coords)), (ix,)), eq.lhs))
                continue
            keys = np.asarray(coords, dtype=np.int64)
            order = np.argsort(keys, kind="stable")
            idx = self.index(ix)  # found on the index's own variables, then broadcast
            at = np.minimum(np.searchsorted(keys[order], idx.data), len(keys) - 1)
            inside = inside & _align(Labelled(keys[order][at] == idx.data, idx.labels), eq.lhs)
            local.append(_align(Labelled(order[at], idx.labels), eq.lhs))
        start = self.domain.from_input(eq.target, np.asarray(prior[np.ix_(*box)]))
        keep = np.broadcast_to(inside, domain)
        places = tuple(np.broadcast_to(i, domain)[keep] for i in local)
        data = self.domain.scatter_add(np.array(start, copy=True), places, values[keep])
        return BoxTensor(data, box, full)

    # -- index expressions: integer arrays labelled by the variables they depend on
    def index(self, ix: IndexExpr) -> Labelled:
        if isinstance(ix, IndexVar):
            if ix in self.var_values:
                return Labelled(self.var_values[ix], (ix,))
            return Labelled(np.arange(self.sizes[ix.extent]), (ix,))
        if isinstance(ix, IndexConst):
            return Labelled(np.asarray(ix.value), ())
        table = self.index_env[ix.tensor]
        decl = self.model.tensor(ix.tensor)
        subs = [self.index(i) for i in ix.indices]
        labels = _union(*(s.labels for s in subs))
        idx = tuple(_align(s, labels) for s in subs)
        values = table[idx] if idx else table
        assert decl.range is not None
        limit = self.sizes[decl.range]
        bad = (values < 0) | (values >= limit)
        if np.any(bad):
            where = tuple(int(w[0]) for w in np.nonzero(np.broadcast_to(bad, np.shape(values))))
            v = int(np.broadcast_to(values, np.shape(bad))[where])
            raise EvalError(f"{ix.tensor}{list(where)} = {v} is outside #{decl.range} "
                            f"(values must be in 0..{limit - 1})")
        return Labelled(np.asarray(values), labels)

    # -- value expressions
    def expr(self, e: Expr) -> Labelled:
        if isinstance(e, Const):
            return Labelled(self.domain.const(e.value), ())
        if isinstance(e, Size):
            return Labelled(self.domain.const(Fraction(self.sizes[e.extent])), ())
        if isinstance(e, Load):
            return self.load(e)
        if isinstance(e, Compare):
            return self.compare(e)
        if isinstance(e, NegInf):
            return Labelled(self.domain.neg_inf(), ())
        if isinstance(e, Op):
            return fold_ops(e, self.expr, self.op, release=True)
        return self.reduction(e)

    def affine(self, a: IndexAffine) -> Labelled:
        parts = [self.index(ix) for _, ix in a.terms]
        labels = _union(*(p.labels for p in parts))
        total = np.asarray(a.const + sum(c * self.sizes[e] for c, e in a.sizes), dtype=np.int64)
        for (c, _), part in zip(a.terms, parts, strict=True):
            total = total + c * _align(part, labels).astype(np.int64)
        return Labelled(total, labels)

    def compare(self, e: Compare) -> Labelled:
        """1 where the condition holds, 0 elsewhere, in the domain's numbers."""
        left, right = self.affine(e.left), self.affine(e.right)
        labels = _union(left.labels, right.labels)
        a, b = _align(left, labels), _align(right, labels)
        held = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
                "eq": np.equal, "ne": np.not_equal}[e.op](a, b)
        one, zero = self.domain.const(Fraction(1)), self.domain.const(Fraction(0))
        return Labelled(np.where(held, one, zero), labels)

    def op(self, e: Op, args: list[Labelled]) -> Labelled:
        labels = _union(*(a.labels for a in args))
        return Labelled(self.domain.op(e.fn, [_align(a, labels) for a in args]), labels)

    def load(self, e: Load) -> Labelled:
        data = self.env[e.tensor]
        plain = all(isinstance(i, IndexVar) and i not in self.var_values for i in e.indices)
        if plain and isinstance(data, np.ndarray) and len(set(e.indices)) == len(e.indices):
            return Labelled(data, tuple(e.indices))  # type: ignore[arg-type]
        subs = [self.index(i) for i in e.indices]
        labels = _union(*(s.labels for s in subs))
        idx = tuple(_align(s, labels) for s in subs)
        if not idx:
            return Labelled(np.asarray(data[()]), labels)
        return Labelled(np.asarray(data[idx]), labels)

    def reduction(self, e: Reduce) -> Labelled:
        if e.op == "sum":
            factors = _factors(e.body)
            if len(factors) > 1:
                return self.contraction(e, factors)
        body = self.expr(e.body)
        keep = tuple(v for v in body.labels if v not in e.vars)
        # a body constant along a reduced variable: a sum multiplies by the count; a max reduces its copies, as a
        # kernel looping over them does (in GF(p) a max is the product Π (r − x) over every point: r − x for one
        # point, (Π (r − x))^count for copies; in float64 copies change nothing). The evaluators skipped a max
        # over one point and took a reduced max for its values (found by a fuzz: max q X0[p] at #Q = 1 and
        # max q s X1[p q], each a plan refused as computing something else)
        missing = [v for v in e.vars if v not in body.labels]
        count = 1
        for v in missing:
            count *= self.sizes[v.extent]
        data = body.data
        if e.op == "max" and missing and len(missing) < len(e.vars):
            data = np.broadcast_to(np.expand_dims(data, tuple(range(len(missing)))),
                                   tuple(self.sizes[v.extent] for v in missing) + np.shape(data))
            labels = (*missing, *body.labels)
            axes = tuple(labels.index(v) for v in e.vars)
            return Labelled(self.domain.reduce("max", data, axes), keep)
        axes = tuple(body.labels.index(v) for v in e.vars if v in body.labels)
        if axes:
            data = self.domain.reduce(e.op, data, axes)
        if e.op == "sum" and count > 1:
            data = self.domain.repeat_sum(data, count)
        elif e.op == "max" and missing:  # no variable in the body: `count` copies of each value
            data = self.domain.repeat_max(data, count)
        return Labelled(data, keep)

    def contraction(self, e: Reduce, factors: list[Expr]) -> Labelled:
        sliced = self._sliced(e, factors)
        if sliced is not None:
            return sliced
        vals = [self.expr(f) for f in factors]
        letters: dict[IndexVar, str] = {}
        for v in _union(*(x.labels for x in vals), e.vars):
            letters[v] = chr(ord("a") + len(letters)) if len(letters) < 26 else chr(ord("A") + len(letters) - 26)
        out = tuple(v for v in _union(*(x.labels for x in vals)) if v not in e.vars)
        subs = ",".join("".join(letters[v] for v in x.labels) for x in vals) + "->" + \
            "".join(letters[v] for v in out)
        data = self.domain.contract([x.data for x in vals], subs)
        missing = [v for v in e.vars if not any(v in x.labels for x in vals)]
        count = 1
        for v in missing:
            count *= self.sizes[v.extent]
        if count > 1:
            data = self.domain.repeat_sum(data, count)
        return Labelled(data, out)


    def _sliced(self, e: Reduce, factors: list[Expr]) -> Labelled | None:
        """A contraction one of whose factors gathers through a variable it keeps (`W[E[r] d h]` in `Σ h
        S[r h] · W[E[r] d h]`), where that factor would hold more than `SLICE_ELEMENTS` values: the same
        contraction over slices of the variable's values, concatenated along it (each slice's values are
        independent of the others'). A Mixtral backward's reference otherwise holds #R · #D · #H weights at
        once (5 · 3072 · 14336 at its witness: 1.8 GB, and four times that in the exact product's limbs)."""
        for f in factors:
            if not isinstance(f, Load):
                continue
            for ix in f.indices:
                if not (isinstance(ix, Gather) and len(ix.indices) == 1 and isinstance(ix.indices[0], IndexVar)):
                    continue
                v = ix.indices[0]
                if v in e.vars:
                    continue
                held = 1
                for u in {u for i in f.indices for u in index_subexprs(i) if isinstance(u, IndexVar)}:
                    held *= len(self.var_values[u]) if u in self.var_values else self.sizes[u.extent]
                if held <= SLICE_ELEMENTS:
                    continue
                had = v in self.var_values
                values = self.var_values[v] if had else np.arange(self.sizes[v.extent])
                step = max(1, SLICE_ELEMENTS * len(values) // held)
                if step >= len(values):
                    continue  # one slice already (a slice of one row larger than the limit: as it is)
                parts: list[Labelled] = []
                try:
                    for lo in range(0, len(values), step):
                        self.var_values[v] = values[lo:lo + step]
                        parts.append(self.contraction(e, factors))
                finally:  # the variable's values as they were (a box's, or every value)
                    if had:
                        self.var_values[v] = values
                    else:
                        del self.var_values[v]
                labels = parts[0].labels  # (v is kept: one of the result's labels)
                return Labelled(np.concatenate([p.data for p in parts], axis=labels.index(v)), labels)
        return None


def _factors(e: Expr) -> list[Expr]:
    """The factors of a product, left to right (iterative: a product of any length)."""
    out: list[Expr] = []
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Op) and x.fn == "mul":
            stack.extend(reversed(x.args))
        else:
            out.append(x)
    return out


# ----------------------------------------------------------------------------- binding inputs


def bind_inputs(model: Model, inputs: dict[str, np.ndarray], where: str = "input",
                fixed: dict[str, int] | None = None) -> dict[str, int]:
    """Check inputs against the model's declarations; return the size of every extent.

    Runtime extents take their size from `fixed` or from the arrays, and every array must agree."""
    sizes: dict[str, int] = {e.name: e.size for e in model.extents if e.size is not None}
    origin: dict[str, str] = {}
    for name, n in (fixed or {}).items():
        sizes[name] = n
        origin[name] = "--shape"
    missing = [t.name for t in model.inputs if t.name not in inputs]
    if missing:
        raise EvalError(f"the {where} lacks {', '.join(missing)} (model {model.name} reads "
                        f"{', '.join(t.name for t in model.inputs)})")
    for t in model.inputs:
        arr = np.asarray(inputs[t.name])
        want = " ".join(f"#{e}" for e in t.extents)
        if t.is_index:
            if arr.dtype.kind not in "iu":
                raise EvalError(f"{t.name} is an index tensor and needs integers, got {arr.dtype}")
        elif arr.dtype.kind not in "fiu":
            raise EvalError(f"{t.name} needs real numbers, got {arr.dtype}")
        if arr.ndim != len(t.extents):
            raise EvalError(f"{t.name} should have shape ( {want} ) = {_shape_text(model, t.extents, sizes)}, "
                            f"got {tuple(arr.shape)}")
        for k, ext in enumerate(t.extents):
            n = int(arr.shape[k])
            e = model.extent(ext)
            if ext in sizes and sizes[ext] != n:
                src = origin.get(ext, "its declaration")
                raise EvalError(f"{t.name} should have shape ( {want} ) = "
                                f"{_shape_text(model, t.extents, sizes)}, got {tuple(arr.shape)}",
                                notes=(f"#{ext} = {sizes[ext]} from {src}",))
            if not e.admits(n):
                raise EvalError(f"{t.name}: #{ext} = {n} is outside its declared range ({e.describe()})")
            sizes[ext] = n
            origin.setdefault(ext, t.name)
    for e in model.extents:
        if e.name not in sizes:
            raise EvalError(f"the size of runtime extent #{e.name} is not fixed by any input; give it with "
                            f"--shape {e.name}=N")
    return sizes


def _shape_text(model: Model, extents: tuple[str, ...], sizes: dict[str, int]) -> str:
    return "(" + ", ".join(str(sizes.get(e, "?")) for e in extents) + ("," if len(extents) == 1 else "") + ")"
