"""A backward node's term that multiplies an elementwise node's factors reads that node (habu.spec.grad, after
the hoist).

Attention's backward holds P, `%h2 = div0(where(c, E, 0), R2)` (E the scores' exp), for dV, and its dS,
`div0(1, R2)·where(c, 1, 0)·E·s·dP + %ds2·where(c, 1, 0)·E·s` with `%ds2 = Σ d dO·−(div0(1, R2)·O)`, multiplies P's
factors again: read as factors, `div0(a, b) = a·div0(1, b)` and `where(c, x, 0) = where(c, 1, 0)·x` (exact in every
domain, b = 0 included), and the row sum's factors that do not read its summed variable taken out of it
(`%ds2 = −div0(1, R2)·D`, `D = Σ d dO·O` a node of its own). dS then reads `P·s·dP − P·D·s`: FlashAttention-2's
`dS = P ⊙ (dP − D)`; E has one reader left, P, which joins the scores' epilogue, and the kernel that made P from E
goes. Distributivity and those identities only: the adjoint check over GF(p) sees the same values.

A node is rewritten only where it then stops reading a tensor of as many axes as the node (the node's read replaces
that one; a node that still read every tensor it did would read one more)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import reduce

from habu.spec.grad_algebra import ONE, ZERO
from habu.spec.grad_factor import terms
from habu.spec.grad_reuse import Renaming, cover_factors, signed_factors, signed_product
from habu.spec.ir import (
    Const,
    Equation,
    Expr,
    IndexVar,
    Load,
    Model,
    Op,
    Reduce,
    TensorDecl,
    free_vars,
    rename_vars,
    tensors_read,
    walk,
)


def normal_factors(e: Expr) -> list[Expr]:
    """`signed_factors`, with `div0(a, b)` as a's factors and `div0(1, b)`, and `where(c, x, 0)` as `where(c, 1, 0)` and
    x's factors."""
    out: list[Expr] = []
    for f in signed_factors(e):
        if isinstance(f, Op) and f.fn == "div0" and f.args[0] != ONE:
            out += [*normal_factors(f.args[0]), Op("div0", (ONE, f.args[1]))]
        elif isinstance(f, Op) and f.fn == "where" and f.args[2] == ZERO and f.args[1] != ONE:
            out += [Op("where", (f.args[0], ONE, ZERO)), *normal_factors(f.args[1])]
        else:
            out.append(f)
    return out


def _sum(ts: list[Expr]) -> Expr:
    return reduce(lambda a, b: Op("add", (a, b)), ts)


@dataclass
class _Split:
    """A row sum `K[L] = Σ V Π F` read as `Π F_out · K'[L]`, F_out its factors that read no summed variable."""

    outer: list[Expr]  # over K's lhs variables
    inner: Reduce  # K' = Σ V Π F_in


def _split(eq: Equation) -> _Split | None:
    r = eq.rhs
    if not isinstance(r, Reduce) or r.op != "sum" or eq.scatter is not None:
        return None
    fs = normal_factors(r.body)
    bound = set(r.vars)
    outer = [f for f in fs if not free_vars(f) & bound]
    inner = [f for f in fs if free_vars(f) & bound]
    if not outer or not inner or any(isinstance(x, Reduce) for f in outer for x in walk(f)):
        return None
    return _Split(outer, Reduce("sum", r.vars, signed_product(inner)))


def _inner_name(split: str) -> str:
    """The node a split row sum's summed factors make: `%ds2_sum` of `%ds2`."""
    return f"{split}_sum"


class _Cover:
    def __init__(self, nodes: list[Equation], intermediates: set[str], decls: dict[str, TensorDecl]):
        self.nodes = nodes
        self.intermediates = intermediates
        self.decls = decls
        self.split: set[str] = set()  # the row sums split (each `_inner_name`'s node made from it)

    def rank(self, tensor: str) -> int:
        return len(self.decls[tensor].extents) if tensor in self.decls else 0

    def expanded(self, fs: list[Expr]) -> list[tuple[list[Expr], str | None]]:
        """The term's factors as they are, then with each read of a split row sum expanded (and which)."""
        out: list[tuple[list[Expr], str | None]] = [(fs, None)]
        by_name = {eq.target: eq for eq in self.nodes}
        for k, f in enumerate(fs):
            if not isinstance(f, Load) or f.tensor not in by_name or f.tensor not in self.intermediates:
                continue
            sp = _split(by_name[f.tensor])
            if sp is None or not all(isinstance(i, IndexVar) for i in f.indices):
                continue
            mapping = dict(zip(by_name[f.tensor].lhs, f.indices, strict=True))
            outer = [rename_vars(g, mapping) for g in sp.outer]  # type: ignore[arg-type]
            out.append(([*fs[:k], *outer, Load(_inner_name(f.tensor), f.indices), *fs[k + 1:]], f.tensor))
        return out

    def cover(self, node: Equation, pattern: list[Expr], term: Expr, splits: set[str]) -> Expr | None:
        """`term` reading `node` where its factors (a split row sum's expanded) hold the node's, else None."""
        for fs, split in self.expanded(normal_factors(term)):
            found = cover_factors(pattern, fs, {}, set())
            if found is None:
                continue
            phi: Renaming = found[0]
            if not all(v in phi for v in node.lhs):
                continue
            left = [f for k, f in enumerate(fs) if k not in found[1]]
            if split is not None:
                splits.add(split)
            return signed_product([Load(node.target, tuple(phi[v] for v in node.lhs)), *left])
        return None

    def rewrite(self, node: Equation, pattern: list[Expr], e: Expr, splits: set[str]) -> Expr:
        if isinstance(e, Reduce):
            return Reduce(e.op, e.vars, self.rewrite(node, pattern, e.body, splits))
        ts = terms(e)
        if len(ts) > 1:
            return _sum([self.rewrite(node, pattern, t, splits) for t in ts])
        got = self.cover(node, pattern, e, splits)
        return got if got is not None else e

    def pays(self, node: Equation, before: Expr, after: Expr) -> bool:
        """Whether the rewritten node stops reading a tensor of as many axes as `node` (else it would read `node`
        besides everything it read: the MoE backward's `%dgate`, whose other term still reads `%dact` and Sgate)."""
        big = {t for t in tensors_read(before) if self.rank(t) >= len(node.lhs)}
        return bool(big - tensors_read(after))


def read_elementwise_products(model: Model) -> Model:
    """The backward model with terms that multiply an elementwise intermediate's factors reading it (the module's
    docstring); the intermediates it reads moved before their first reader, new row sums after the ones they split."""
    inter = {t.name for t in model.intermediates}
    decls = {t.name: t for t in (*model.inputs, *model.outputs, *model.intermediates)}
    nodes = list(model.nodes)
    cover = _Cover(nodes, inter, decls)
    for name in [n.target for n in nodes]:
        eq = next(n for n in nodes if n.target == name)
        if eq.target not in inter or eq.scatter is not None or any(isinstance(x, Reduce) for x in walk(eq.rhs)):
            continue
        pattern = normal_factors(eq.rhs)
        if len(pattern) < 2 or any(isinstance(f, Const) for f in pattern) or len(set(eq.lhs)) < len(eq.lhs) \
                or not set(eq.lhs) <= set().union(*(free_vars(f) for f in pattern)):
            continue
        reads = tensors_read(eq.rhs)  # a node after eq's last producer may read eq instead
        after = max((k for k, n in enumerate(nodes) if n.target in reads), default=-1) + 1
        for i in range(after, len(nodes)):
            m = nodes[i]
            if m is eq or eq.target in tensors_read(m.rhs):
                continue
            splits: set[str] = set()
            rhs = cover.rewrite(eq, pattern, m.rhs, splits)
            if rhs != m.rhs and cover.pays(eq, m.rhs, rhs):
                nodes[i] = replace(m, rhs=rhs)  # (the list `cover` reads)
                cover.split |= splits
        readers = [k for k, n in enumerate(nodes) if eq.target in tensors_read(n.rhs)]
        at = nodes.index(next(n for n in nodes if n.target == eq.target))
        if readers and readers[0] < at:
            nodes.insert(readers[0], nodes.pop(at))
    new_inter = list(model.intermediates)
    for split in sorted(cover.split):
        k = next(j for j, n in enumerate(nodes) if n.target == split)
        sp = _split(nodes[k])
        assert sp is not None
        nodes.insert(k, Equation(_inner_name(split), nodes[k].lhs, sp.inner))
        new_inter.append(TensorDecl(_inner_name(split), decls[split].extents, None))
        if not any(split in tensors_read(n.rhs) for n in nodes):
            nodes.pop(k + 1)
            new_inter = [t for t in new_inter if t.name != split]
    return replace(model, nodes=tuple(nodes), intermediates=tuple(new_inter))
