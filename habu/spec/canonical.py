"""The canonical form of a model: what `Model.canonical_hash()` hashes. Every incidental name (extents,
intermediates, bound index variables) is replaced by its order of first appearance, so the hash
changes only with what the model computes and the names of its inputs and outputs."""

from __future__ import annotations

import json
from dataclasses import dataclass

from habu.spec.ir import (
    Compare,
    Const,
    Equation,
    Expr,
    IndexConst,
    IndexExpr,
    IndexVar,
    Load,
    Model,
    NegInf,
    Reduce,
    Size,
    TensorDecl,
    fold_ops,
)


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
        out = [tname(t.name), [ext(e) for e in t.extents], t.dtype.name if t.dtype else None,
               ext(t.range) if t.range else None]
        return [*out, "grouped"] if t.grouped else out  # other hashes are unchanged

    def node(eq: Equation) -> list:
        var = _Namer("v")

        def ix(i: IndexExpr) -> list:
            if isinstance(i, IndexVar):
                return ["var", var(i.name), ext(i.extent)]
            if isinstance(i, IndexConst):
                return ["const", i.value]
            return ["gather", tname(i.tensor), [ix(s) for s in i.indices]]

        def leaf(e: Expr) -> list:
            if isinstance(e, Const):
                return ["const", str(e.value)]
            if isinstance(e, Size):
                return ["size", ext(e.extent)]
            if isinstance(e, Load):
                return ["load", tname(e.tensor), [ix(i) for i in e.indices]]
            if isinstance(e, Compare):
                def side(a) -> list:
                    return [[[c, ix(i)] for c, i in a.terms], [[c, ext(x)] for c, x in a.sizes], a.const]

                return ["compare", e.op, side(e.left), side(e.right)]
            if isinstance(e, NegInf):
                return ["neginf"]
            assert isinstance(e, Reduce)
            bound = [[var(v.name), ext(v.extent)] for v in e.vars]
            return ["reduce", e.op, bound, ex(e.body)]

        def ex(e: Expr) -> list:
            return fold_ops(e, leaf, lambda o, args: ["op", o.fn, args])

        lhs = [[var(v.name), ext(v.extent)] for v in eq.lhs]
        if eq.scatter is not None:  # only scatters carry a fourth entry: other hashes are unchanged
            return [tname(eq.target), lhs, ex(eq.rhs), ["scatter", [ix(i) for i in eq.scatter]]]
        return [tname(eq.target), lhs, ex(eq.rhs)]

    nodes = [node(eq) for eq in model.nodes]
    out = {
        "inputs": [decl(t) for t in model.inputs],
        "outputs": [decl(t) for t in model.outputs],
        "intermediates": [decl(t) for t in model.intermediates],
        "nodes": nodes,
    }
    # the declared sizes and ranges of the extents named above, by canonical name: two models that
    # differ only in a static size (128 or 256 EXTENT: #K) compute different things
    declared = {e.name: e.declaration() for e in model.extents}
    out["extents"] = [[canon, list(declared[name])] for name, canon in ext.names.items() if name in declared]
    return out


def compact_json(value: object) -> str:
    """`json.dumps(value, sort_keys=True, separators=(",", ":"))`, written without recursion so that
    the nested lists of a long operator chain do not reach Python's recursion limit."""
    out: list[str] = []
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Text):
            out.append(item.text)
        elif isinstance(item, list | tuple):
            out.append("[")
            stack.append(_Text("]"))
            for k, sub in enumerate(reversed(item)):
                stack.append(sub)
                if k < len(item) - 1:
                    stack.append(_Text(","))
        elif isinstance(item, dict):
            out.append("{")
            stack.append(_Text("}"))
            keys = sorted(item)
            for k, key in enumerate(reversed(keys)):
                stack.append(item[key])
                stack.append(_Text(json.dumps(str(key)) + ":"))
                if k < len(keys) - 1:
                    stack.append(_Text(","))
        else:
            out.append(json.dumps(item))
    return "".join(out)


@dataclass(frozen=True)
class _Text:
    """Literal output in `compact_json`."""

    text: str
