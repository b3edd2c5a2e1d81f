"""Lowering the general kernel family: any one equation node, a thread per output element.

Thread t of block b computes the output element at flat index e = b·threads + t (`thread_map`,
`FlatThreads`; with `elements` n > 1, the n elements (b·n + v)·threads + t, v < n; row-major over the
output's extents, as the map kernel walks them; for a scatter `Y[IX[r] n] += ...`, over its domain
(r, n), each thread adding its value into Y[IX[r] n] with f32 atomicAdd, `Store.ATOMIC_ADD`): its coordinates e0, e1, ... come from `coordinates`
(e0 is not reduced modulo its extent, so a thread past the last element fails the output's mask,
`lane_guard`). Every reduction (Σ or max, nested or several) is a loop over its variables' extents,
0 .. `loop_end`, accumulating in f32; every load is an `Access` (gathers at any index position,
repeated indices), read as 0 where its mask fails. The finite-field interpreter
(`habu.prove.interp_general`), the rules (`habu.prove.rules_general`) and the emitter
(`habu.emit_cuda.emit_general`) read these methods, so what is proven is what is printed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from habu.errors import HabuError
from habu.lower.access import Access, FlatGrid, IndexArith, VectorAccess, access_for, size_of
from habu.lower.lanes import FlatThreads
from habu.lower.rows import inline_region, load_index_vars
from habu.plan.patterns import stored_nodes
from habu.plan.plan import GeneralKernel
from habu.spec.dtypes import DTYPES
from habu.spec.ir import (
    Compare,
    Const,
    Equation,
    Expr,
    Gather,
    IndexExpr,
    IndexVar,
    Load,
    Model,
    NegInf,
    Op,
    Reduce,
    Size,
    walk,
)


class Store(Enum):
    """How a general kernel's thread stores its value."""

    WRITE = "write"  # overwrite the element (each element has one thread)
    ATOMIC_ADD = "atomic-add"  # f32 atomicAdd (a scatter: threads may share an element)


@dataclass(frozen=True)
class GeneralLowering(FlatGrid):
    kernel: GeneralKernel
    extents: tuple[str, ...]  # the output's shape; axis e{i} runs over extents[i]
    node: Equation  # lhs renamed to e0, e1, ...; every reduction variable to its own loop axis k0, k1, ...
    loops: tuple[tuple[str, str], ...]  # (loop axis, extent) of every reduction variable
    loads: tuple[tuple[Load, Access], ...]  # every load of the renamed node, once
    out: Access
    index_width: int
    thread_map: FlatThreads  # which output element each thread computes (habu/lower/lanes.py)
    store: Store = Store.WRITE

    @property
    def scatters(self) -> bool:
        """Whether the node is a scatter (`Y[IX[r] n] += ...`): its threads are the points of its
        domain, and several may store to one element of its target."""
        return self.node.scatter is not None

    @property
    def nodes(self) -> tuple[Equation, ...]:
        return (self.node,)

    @property
    def per_block(self) -> int:
        """Output elements one block computes: `elements` sweeps of `vector` a thread."""
        return self.kernel.threads * self.kernel.elements * self.kernel.vector

    @property
    def vector(self) -> int:
        """Consecutive elements a thread moves at once (the plan's; `thread_map` places them)."""
        return self.kernel.vector

    def contiguous(self, acc: Access) -> bool:
        """Whether an access walks its innermost dimension with the output's last axis (stride 1) and no
        other position reads that axis: a thread's vector of consecutive elements is then consecutive in
        memory (one vector load or store)."""
        if not self.extents or not acc.positions:  # (a scalar operand: one value, read by every element)
            return False
        last = f"e{len(self.extents) - 1}"
        *outer, inner = acc.positions
        return (inner.kind == "axis" and inner.axis == last and acc.strides[-1] == ()
                and all(p.axis != last for p in outer if p.kind != "const"))

    def reads_last_axis(self, acc: Access) -> bool:
        return bool(self.extents) and any(p.kind != "const" and p.axis == f"e{len(self.extents) - 1}"
                                          for p in acc.positions)

    def vector_refusal(self) -> str | None:
        """Why this kernel cannot move `vector` elements at once (None when it can, or moves one): it needs
        an output with extents, no reduction inside another's body (each reduction's loop runs once for the
        whole vector, `vector` accumulators), and each access either contiguous along the last axis or
        independent of it (a gathered row index, a broadcast), at most 16 bytes a vector. That the last
        extent is a multiple of the vector (so a vector never crosses a row and every vector access is
        aligned) is a size fact: the `vector-align` rule (habu/prove/rules_general.py)."""
        n = self.vector
        if n == 1:
            return None
        if not self.extents:
            return "a general kernel with a scalar output moves one element a thread"
        if any(isinstance(x, Reduce) for r in self.reductions() for x in walk(r.body)):
            return "a general kernel with a reduction inside another moves one element a thread"
        for acc in (*(a for _, a in self.loads), self.out):
            if self.reads_last_axis(acc) and not self.contiguous(acc):
                return f"{acc.tensor} is not read contiguously along the output's last axis"
            if self.contiguous(acc) and n * DTYPES[acc.dtype].bytes > 16:
                return f"{n} elements of {acc.tensor} ({acc.dtype}) are more than 16 bytes"
        return None

    def vector_conditions(self, sizes: Mapping[str, Any]) -> list[tuple[str, str, Any, str]]:
        """What sizes must satisfy for `vector` elements a thread (after `vector_refusal`), as (tensor,
        statement, condition, detail when it fails); conditions over `sizes` (ints, or z3 terms for the
        rules): the last extent a multiple of the vector (a vector never crosses a row: the guard printed
        at its first element holds for all, and `lane_coordinates` is the element a vector access reaches)
        and each vector access starting aligned (its strides outside the innermost dimension multiples)."""
        n = self.vector
        if n == 1:
            return []
        last = self.extents[-1]
        out = [(self.out.tensor, f"{n}-element vectors stay inside a row (#{last} a multiple of {n})",
                size_of(last, sizes) % n == 0, f"#{last} is not a multiple of {n}")]
        for acc in (*(a for _, a in self.loads), self.out):
            if self.contiguous(acc):
                out += [(acc.tensor, f"{n}-element vectors of {acc.tensor} start aligned (its stride along dimension "
                                     f"{i} a multiple of {n})", acc.stride(i, sizes) % n == 0,
                         f"a stride of {acc.tensor} is not a multiple of {n}") for i in range(len(acc.positions) - 1)]
        return out

    def vector_accesses(self) -> tuple[VectorAccess, ...]:
        """The loads and the store that move `vector` consecutive elements (none at one)."""
        if self.vector == 1:
            return ()
        return tuple(VectorAccess(acc.tensor, self.vector, f"{self.vector}-element vectors of {acc.tensor}")
                     for acc in (*(a for _, a in self.loads), self.out) if self.contiguous(acc))

    def lane_coordinates(self, coord: Mapping[str, Any], j: int) -> dict[str, Any]:
        """The coordinates of element j of a thread's vector: the first element's with the last axis + j
        (what a vector access at the first element's offset reaches as its element j)."""
        if j == 0:
            return dict(coord)
        last = f"e{len(self.extents) - 1}"
        return {**coord, last: coord[last] + j}

    def lane_guard(self, coord: Mapping[str, Any], flat: Any, sizes: Mapping[str, Any], arith: IndexArith) -> Any:
        """Whether the thread computes an element: the output's mask at its coordinates (a scalar output:
        only flat element 0)."""
        if not self.extents:
            return arith.lt(flat, 1)
        return self.out.mask(coord, sizes, arith)

    def loop_end(self, axis: str, sizes: Mapping[str, Any]) -> Any:
        """The end (exclusive) of a reduction loop: its extent's size."""
        return sizes[dict(self.loops)[axis]]

    def reductions(self) -> tuple[Reduce, ...]:
        """The node's outermost reductions, in the order they appear, each once (a vector kernel runs each loop
        once)."""
        out: list[Reduce] = []
        stack: list[Expr] = [self.node.rhs]
        while stack:
            x = stack.pop()
            if isinstance(x, Reduce):
                out.append(x)
            elif isinstance(x, Op):
                stack.extend(reversed(x.args))
        return tuple(dict.fromkeys(out))

    def loop_axes(self, r: Reduce) -> tuple[str, ...]:
        return tuple(v.name for v in r.vars)

    def access(self, ld: Load) -> Access:
        return next(a for x, a in self.loads if x == ld)


class _Renamer:
    """Left-side variables to e{i}; each reduction's variables to fresh loop axes k{j} (shadowing allowed)."""

    def __init__(self) -> None:
        self.loops: list[tuple[str, str]] = []

    def index(self, ix: IndexExpr, mapping: Mapping[IndexVar, IndexVar]) -> IndexExpr:
        if isinstance(ix, IndexVar):
            return mapping[ix]
        if isinstance(ix, Gather):
            return Gather(ix.tensor, tuple(self.index(j, mapping) for j in ix.indices))
        return ix

    def expr(self, e: Expr, mapping: Mapping[IndexVar, IndexVar]) -> Expr:
        if isinstance(e, Load):
            return Load(e.tensor, tuple(self.index(i, mapping) for i in e.indices))
        if isinstance(e, Op):
            return Op(e.fn, tuple(self.expr(a, mapping) for a in e.args))
        if isinstance(e, Reduce):
            inner = dict(mapping)
            new: list[IndexVar] = []
            for v in e.vars:
                axis = IndexVar(f"k{len(self.loops)}", v.extent)
                self.loops.append((axis.name, v.extent))
                inner[v] = axis
                new.append(axis)
            return Reduce(e.op, tuple(new), self.expr(e.body, inner))
        if isinstance(e, Compare):  # a condition on indices: over the renamed axes
            for ix in e.index_exprs():
                if isinstance(ix, Gather) and (len(ix.indices) != 1 or not isinstance(ix.indices[0], IndexVar)):
                    raise HabuError(f"no kernel computes a condition reading {ix.tensor} through several or "
                                    "nested indices yet; one index variable (j < LEN[b]) is computed")
            return e.map_indices(lambda i: self.index(i, mapping))
        assert isinstance(e, Const | Size | NegInf)
        return e


def chain_refusal(model: Model, names: tuple[str, ...], inlined: int | None = None) -> str | None:
    """Why the nodes `names` are not one general kernel's chain (None: they are): each of the first
    `inlined` (all but the last by default) must be elementwise (no reduction, no scatter), and only the
    last may be stored (no earlier one an output or read by another kernel)."""
    nodes = [next(e for e in model.nodes if e.target == t) for t in names]
    for eq in nodes[:len(nodes) - 1 if inlined is None else inlined]:
        if eq.scatter is not None or any(isinstance(x, Reduce) for x in walk(eq.rhs)):
            return f"a general kernel inlines only elementwise nodes, not {eq.target}"
    if len(nodes) > 1 and stored_nodes(model, names) != names[-1:]:
        return f"a general kernel stores one node, not {', '.join(stored_nodes(model, names))}"
    return None


def chain_node(model: Model, names: tuple[str, ...]) -> Equation:
    """The one node a general kernel computes: `names`' last, each earlier node inlined where it reads it
    (a chain of elementwise nodes, `T3 = GELU(T2)` after `T2 = S1 + B1`; `chain_refusal` says which are)."""
    nodes = [next(e for e in model.nodes if e.target == t) for t in names]
    if len(nodes) == 1:
        return nodes[0]
    if (why := chain_refusal(model, names)) is not None:
        raise ValueError(why)
    last = nodes[-1]
    return Equation(last.target, last.lhs, inline_region(last.rhs, {eq.target: eq for eq in nodes[:-1]}), last.scatter)


def lower_general(model: Model, kernel: GeneralKernel, storage: Mapping[str, str] | None = None) -> GeneralLowering:
    eq = chain_node(model, kernel.nodes)
    extents = tuple(v.extent for v in eq.lhs)
    axes = tuple(IndexVar(f"e{i}", e) for i, e in enumerate(extents))
    renamer = _Renamer()
    rhs = renamer.expr(eq.rhs, dict(zip(eq.lhs, axes, strict=True)))  # the domain's variables to e{i}
    mapping = dict(zip(eq.lhs, axes, strict=True))
    scatter = None if eq.scatter is None else tuple(renamer.index(ix, mapping) for ix in eq.scatter)
    node = Equation(eq.target, axes, rhs, scatter)
    extent_of_axis = {a.name: a.extent for a in axes} | dict(renamer.loops)
    loads: list[tuple[Load, Access]] = []
    for x in walk(rhs):
        if isinstance(x, Load) and not any(x == ld for ld, _ in loads):
            if x.tensor == eq.target and x.indices != axes:
                # an in-place update reads the element its thread writes, before writing it
                raise ValueError(f"{eq.target} reads its own result at other elements than the one it writes")
            axis_of = {v: v.name for v in load_index_vars(x)}
            loads.append((x, access_for(model.tensor(x.tensor), x.indices, axis_of, extent_of_axis, storage)))
    out = access_for(model.tensor(eq.target), node.store_indices, {a: a.name for a in axes}, extent_of_axis, storage)
    store = Store.ATOMIC_ADD if scatter is not None else Store.WRITE
    return GeneralLowering(kernel, extents, node, tuple(renamer.loops), tuple(loads), out, kernel.index_width,
                           FlatThreads(kernel.threads, kernel.elements, kernel.vector, kernel.reverse), store)
