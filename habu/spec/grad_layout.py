"""A hoisted elementwise node takes the layout of the node it reads, where its readers are products that read it
in either layout.

The invariant hoist lays a node out in its reader's variables, then the enclosing sums' (`hoist_statistics`):
attention's P for dV, `%h3[b g j r i] = div0(where(…, %h4[b g r i j], 0), R2[b g r i])`, where the contraction
`dV = Σ r i dO[b g r i d] · %h3[b g j r i]` reads its k axis (i) innermost. But %h3 then transposes the shared exp
`%h4[b g r i j]`: a general kernel that read %h4 down its columns, 67.6 µs of the bf16 backward's 285 (H100,
session 63), where an elementwise map over %h4's own layout reads and writes rows. A product reads its operand
in either order (wgmma and mma.sync an MN-major operand through TMA boxes or ldmatrix.trans, the SIMT path's copies
either order), so such a node takes the layout of the load it transposes, and its readers read it at the same
variables, permuted. Same values: only where the node's elements are stored moves."""

from __future__ import annotations

from dataclasses import replace

from habu.spec.grad_factor import has_reduce
from habu.spec.ir import Equation, Expr, IndexVar, Load, Op, Reduce, map_ops, tensors_read, walk


def _transposed_load(eq: Equation, names: set[str]) -> tuple[IndexVar, ...] | None:
    """The variables of the load of another node (of `names`) that reads all of eq's, in another order, where eq
    is elementwise; None otherwise."""
    if has_reduce(eq.rhs):
        return None
    for x in walk(eq.rhs):
        if isinstance(x, Load) and x.tensor in names and all(isinstance(i, IndexVar) for i in x.indices) \
                and len(x.indices) == len(eq.lhs) and set(x.indices) == set(eq.lhs) and tuple(x.indices) != eq.lhs:
            return tuple(x.indices)  # type: ignore[arg-type]
    return None


def _product_of_loads(e: Expr) -> bool:
    """`Σ … A[…] · B[…]`: a contraction of two loads."""
    return isinstance(e, Reduce) and e.op == "sum" and isinstance(e.body, Op) and e.body.fn == "mul" \
        and len(e.body.args) == 2 and all(isinstance(a, Load) for a in e.body.args)


def follow_producer_layout(nodes: tuple[Equation, ...], made: set[str]) -> tuple[tuple[Equation, ...], dict[str, tuple[str, ...]]]:
    """The nodes with each hoisted node of `made` that transposes another one laid out as that one (see the
    module's docstring), and the new extents of each node moved."""
    out = list(nodes)
    names = {n.target for n in out}
    moved: dict[str, tuple[str, ...]] = {}
    for i, eq in enumerate(out):
        layout = _transposed_load(eq, names) if eq.target in made else None
        if layout is None:
            continue
        readers = [j for j, n in enumerate(out) if eq.target in tensors_read(n.rhs)]
        if not readers or not all(_product_of_loads(out[j].rhs) for j in readers):
            continue
        old = eq.lhs
        to_old = [old.index(v) for v in layout]  # new position p holds old position to_old[p]

        def reread(x: Expr, target: str = eq.target, to_old: list[int] = to_old) -> Expr:
            if isinstance(x, Load) and x.tensor == target:
                return Load(target, tuple(x.indices[q] for q in to_old))
            return x

        out[i] = Equation(eq.target, layout, eq.rhs, eq.scatter)
        for j in readers:
            body = out[j].rhs
            assert isinstance(body, Reduce)
            out[j] = replace(out[j], rhs=Reduce(body.op, body.vars, map_ops(body.body, reread)))
        moved[eq.target] = tuple(v.extent for v in layout)
    return tuple(out), moved


__all__ = ["follow_producer_layout"]
