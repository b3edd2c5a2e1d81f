"""The models the derivation builds (habu/spec/grad.py): the backward's, its inputs the declared tensors it reads in
order of first read and its extents those it uses; the forward's with its saved values renamed and made outputs."""

from __future__ import annotations

from dataclasses import replace

from habu.spec.dtypes import activation_dtype, dtype_named
from habu.spec.ir import (
    Compare,
    Equation,
    Expr,
    Gather,
    IndexExpr,
    Load,
    Model,
    Reduce,
    Size,
    TensorDecl,
    index_subexprs,
    map_ops,
    scatter_gathers,
    walk,
)


def rename_tensors(eq: Equation, renames: dict[str, str]) -> Equation:
    if not renames:
        return eq

    def ix(i: IndexExpr) -> IndexExpr:
        if isinstance(i, Gather):
            return Gather(renames.get(i.tensor, i.tensor), tuple(ix(j) for j in i.indices))
        return i

    def go(e: Expr) -> Expr:
        def leaf(x: Expr) -> Expr:
            if isinstance(x, Load):
                return Load(renames.get(x.tensor, x.tensor), tuple(ix(i) for i in x.indices))
            if isinstance(x, Reduce):
                return Reduce(x.op, x.vars, go(x.body))
            if isinstance(x, Compare):
                return x.map_indices(ix)
            return x

        return map_ops(e, leaf)

    return replace(eq, target=renames.get(eq.target, eq.target), rhs=go(eq.rhs))


def assemble_model(fwd: Model, name: str, nodes: list[Equation], decls: dict[str, TensorDecl],
              intermediates: set[TensorDecl], outputs: list[str]) -> Model:
    """A model from nodes: its inputs are the declared tensors it reads (in order of first read)."""
    read: dict[str, None] = {}
    for eq in nodes:
        for t in reads_in_order(eq):
            read.setdefault(t)
    inter_names = {t.name for t in intermediates}
    inputs = tuple(decls[t] for t in read if t in decls and t not in inter_names)
    outs = tuple(decls[o] for o in outputs)
    used = {e for t in (*inputs, *outs, *intermediates) for e in (*t.extents, *((t.range,) if t.range else ()))}
    for eq in nodes:
        used |= {v.extent for v in eq.lhs}
        for x in walk(eq.rhs):
            if isinstance(x, Size):
                used.add(x.extent)
            if isinstance(x, Compare):
                used |= set(x.extents())
            if isinstance(x, Reduce):
                used |= {v.extent for v in x.vars}
    extents = tuple(e for e in fwd.extents if e.name in used)
    by_name = {t.name: t for t in intermediates}
    inter = tuple(by_name[eq.target] for eq in nodes if eq.target in by_name)
    obligations = tuple(o for o in fwd.obligations if o.tensor in read or (o.tensor is None and o.extent in used))
    return Model(name, "composition", extents, inputs, outs, inter, tuple(nodes), obligations)


def reads_in_order(eq: Equation) -> list[str]:
    """The tensors a node reads, in order of first appearance (a scatter's target and gathers last)."""
    out: dict[str, None] = {}
    for x in walk(eq.rhs):
        if isinstance(x, Load):
            out.setdefault(x.tensor)
        if isinstance(x, Load | Compare):  # a condition's indices read index tensors too (j < LEN[b])
            for ix in (x.indices if isinstance(x, Load) else x.index_exprs()):
                for sub in index_subexprs(ix):
                    if isinstance(sub, Gather):
                        out.setdefault(sub.tensor)
    if eq.scatter is not None:
        out.setdefault(eq.target)
        for g in scatter_gathers(eq):
            out.setdefault(g.tensor)
    return list(out)


def saved_dtype(fwd: Model, name: str) -> str:
    """A saved forward value's type: a row statistic (`hoist_statistics`' `%s` nodes: RMSNorm's rstd, softmax's
    maximum and sum, over a row's leading axes however many: `R1[b s]`, attention's `R2[b g r i]`, which were bf16
    until session 62) and any vector f32, any other matrix in the forward's activation type (what its plan
    stores it in)."""
    if name.startswith("%s") or len(fwd.tensor(name).extents) <= 1:
        return "f32"
    return activation_dtype(fwd.inputs, frozenset(t.name for t in fwd.outputs))


def with_saved_outputs(fwd: Model, saved: dict[str, str]) -> Model:
    """The forward model, its saved intermediates renamed and made outputs (`saved_dtype`); a saved output (one
    the backward reads: habu.spec.grad_reuse) is one already."""
    saved = {t: s for t, s in saved.items() if t not in {o.name for o in fwd.outputs}}
    if not saved:
        return fwd
    nodes = tuple(rename_tensors(eq, saved) for eq in fwd.nodes)
    outs = fwd.outputs + tuple(TensorDecl(s, fwd.tensor(t).extents, dtype_named(saved_dtype(fwd, t)))
                               for t, s in saved.items())
    inter = tuple(t for t in fwd.intermediates if t.name not in saved)
    return replace(fwd, nodes=nodes, outputs=outs, intermediates=inter)
