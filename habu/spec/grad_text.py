"""A derived backward model as Habu text (`habu grad`).

The language writes a model of several equations only as a composition of words on a stack, which
cannot name an intermediate read twice; so the text declares every tensor the backward passes between
its equations and gives each equation its own `MODEL:`, in the order they run (`NAME-GRAD-1`, `-2`,
…). Every model of the text is a plain equation model: `habu check` reads it and `habu compile
--model NAME-GRAD-k` compiles each step; `habu compile --backward` compiles the whole backward model
as one (its intermediates then never reach memory unless the plan stores them).
"""

from __future__ import annotations

from fractions import Fraction

from habu.spec.equation import format_equation
from habu.spec.grad import Backward
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
    Op,
    Reduce,
    TensorDecl,
    fold_ops,
    map_ops,
)


def _exact(e: Expr) -> Expr:
    """`e` with every constant that would not read back exactly from its shortest decimal written as
    a quotient of integers (a derivative rule's 2/√π is a binary fraction)."""

    def leaf(x: Expr) -> Expr:
        if isinstance(x, Const) and x.value.denominator != 1 and Fraction(repr(float(x.value))) != x.value:
            return Op("div", (Const(Fraction(x.value.numerator)), Const(Fraction(x.value.denominator))))
        if isinstance(x, Reduce):
            return Reduce(x.op, x.vars, _exact(x.body))
        return x

    return map_ops(e, leaf)


class _VarNames:
    """Readable index names for one equation: `b`, `b2`, … by extent (`d2'`, `d2''` where the
    extent's name ends in a digit), never a name another extent would claim."""

    def __init__(self, extents: list[str]):
        self.lower = {e.lower(): e for e in extents}
        self.used: set[str] = set()
        self.names: dict[IndexVar, IndexVar] = {}

    def __call__(self, v: IndexVar) -> IndexVar:
        if v in self.names:
            return self.names[v]
        base = v.extent.lower()
        k = 1
        while True:
            if k == 1:
                name = base
            else:
                name = base + ("'" * (k - 1) if base[-1].isdigit() else str(k))
            k += 1
            claimed = self.lower.get(name.rstrip("'"))
            if name not in self.used and (claimed is None or claimed == v.extent):
                break
        self.used.add(name)
        self.names[v] = IndexVar(name, v.extent)
        return self.names[v]


def readable(eq: Equation, extents: list[str], tensors: dict[str, str]) -> Equation:
    """`eq` with its index variables named after their extents and its tensors renamed."""
    names = _VarNames(extents)

    def ix(i: IndexExpr) -> IndexExpr:
        if isinstance(i, IndexVar):
            return names(i)
        if isinstance(i, Gather):
            return Gather(tensors.get(i.tensor, i.tensor), tuple(ix(j) for j in i.indices))
        return i

    lhs = tuple(names(v) for v in eq.lhs)
    scatter = tuple(ix(i) for i in eq.scatter) if eq.scatter is not None else None

    def go(e: Expr) -> Expr:
        def leaf(x: Expr) -> Expr:
            if isinstance(x, Load):
                return Load(tensors.get(x.tensor, x.tensor), tuple(ix(i) for i in x.indices))
            if isinstance(x, Reduce):
                return Reduce(x.op, tuple(names(v) for v in x.vars), go(x.body))  # type: ignore[misc]
            if isinstance(x, Compare):
                return x.map_indices(ix)
            return x

        return fold_ops(e, leaf, lambda o, a: Op(o.fn, tuple(a)))

    return Equation(tensors.get(eq.target, eq.target), lhs, _exact(go(eq.rhs)), scatter)


def tensor_names(model: Model) -> dict[str, str]:
    """Names for the model's intermediates (`%3` is `T3`, `%d3` its gradient `dT3`, `%s1` a row
    statistic `Q1`), none equal to another tensor's."""
    taken = {t.name for t in (*model.inputs, *model.outputs)}
    out: dict[str, str] = {}
    for t in model.intermediates:
        raw = t.name.lstrip("%")
        grad = raw.startswith("d")
        raw = raw[1:] if grad else raw
        base = ("Q" + raw[1:]) if raw.startswith("s") else f"T{raw}"
        name = ("d" if grad else "") + base
        while name in taken:
            name += "_"
        taken.add(name)
        out[t.name] = name
    return out


def _decl_line(t: TensorDecl, name: str) -> str:
    dtype = t.dtype.name if t.dtype is not None else "f32"
    if t.is_index:
        exts = " ".join(f"#{e}" for e in (*t.extents, t.range))
        return f"{dtype} {'GROUPS:' if t.grouped else 'ITENSOR:'} {name} ( {exts} )"
    return f"{dtype} TENSOR: {name} ( {' '.join('#' + e for e in t.extents)} )".replace("(  )", "( )")


def backward_text(bw: Backward, source: str = "") -> str:
    """The backward model as a Habu file: declarations, then one equation MODEL per step, in order."""
    m = bw.model
    names = tensor_names(m)
    extents = [e.name for e in m.extents]
    fwd_name = bw.forward.name
    lines = [f"\\ The backward of MODEL {fwd_name}{' in ' + source if source else ''}, derived by habu grad "
             f"(save policy: {bw.policy.mode.value}).",
             f"\\ Run the models {m.name}-1 ... {m.name}-{len(m.nodes)} in order: each defines one tensor.",
             "\\ " + "; ".join(f"{c} is the gradient of the loss by {o}" for o, c in bw.cotangents)]
    if bw.saved:
        lines.append("\\ saved by the forward (habu.spec.grad: Backward.forward): " +
                     ", ".join(f"{s} (its output)" if t == s else f"{s} (its {t})" for t, s in bw.saved))
    if bw.choices:
        saved = dict(bw.saved)
        lines.append("\\ the forward values it reads (each saved or recomputed: habu grad --save, SavePolicy): " +
                     ", ".join(f"{c} saved as {saved[c]}" if c in saved else f"{c} recomputed as {names.get(c, c)}"
                               for c in bw.choices))
    if bw.accumulated:
        lines.append("\\ the gradients are added into " + ", ".join(bw.accumulated) +
                     " (scatters): give them zeros, or the gradients to accumulate onto")
    lines.append("\\ gradients: " + ", ".join(f"{g} of {x}" for x, g in bw.gradients))
    lines.append("")
    for e in m.extents:
        lines.append(f"{e.bound_text() if not e.declared else _declared(e.declared)} EXTENT: #{e.name}")
    lines.append("")
    declared: set[str] = set()
    for t in (*m.inputs, *m.outputs, *m.intermediates):
        if t.name not in declared:
            declared.add(t.name)
            lines.append(_decl_line(t, names.get(t.name, t.name)))
    lines.append("")
    for k, eq in enumerate(m.nodes, 1):
        text = format_equation(readable(eq, extents, names))
        lines.append(f"MODEL: {m.name}-{k}  {text} ;")
    return "\n".join(lines) + "\n"


def _declared(d: tuple[int, ...]) -> str:
    if len(d) == 1:
        return str(d[0])
    lo, hi, mult = d
    return f"{lo}..{hi}" + (f"%{mult}" if mult > 1 else "")


__all__ = ["backward_text", "readable", "tensor_names"]
