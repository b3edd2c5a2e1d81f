"""A MODEL of several equations, one after another, sharing intermediates:

    MODEL: MOE-FFN
       gate[r h] = Σ d X[IX[r] d] · W1[E[r] h d]
       up[r h]   = Σ d X[IX[r] d] · W3[E[r] h d]
       act[r h]  = gate[r h] · sigmoid(gate[r h]) · up[r h]
       Y[IX[r] d] += P[r] · Σ h act[r h] · W2[E[r] d h] ;

An equation begins where its target does: the tensor named just before a `=` or `+=` at the top level
(outside brackets and parentheses), with its `[...]`. A target that is not a declared tensor is an
*intermediate* of the model: its extents come from its left side's index variables, the plan chooses
its storage, and a later equation must read it. Declared targets are the model's outputs.
"""

from __future__ import annotations

from habu.errors import HabuError
from habu.spec.builder import GraphBuilder
from habu.spec.equation import EquationParser, TensorType, _is_ident
from habu.spec.ir import Model, TensorDecl, loads, node_reads
from habu.spec.lexer import Token
from habu.spec.program import ModelScope, Program

_OPEN = {"[": "]", "(": ")"}
_CLOSE = {"]", ")"}


def equation_starts(tokens: list[Token]) -> list[int]:
    """Where each equation begins: 0, then the target of every later top-level `=` or `+=`."""
    starts = [0]
    depth = 0
    seen_first = False
    for j, tok in enumerate(tokens):
        if tok.text in _OPEN:
            depth += 1
        elif tok.text in _CLOSE:
            depth = max(0, depth - 1)
        elif tok.text == "=" and depth == 0:
            if not seen_first:
                seen_first = True
                continue
            s = _target_start(tokens, j)
            if s is not None and s > starts[-1]:
                starts.append(s)
    return starts


def _target_start(tokens: list[Token], eq: int) -> int | None:
    """The index of the target name of the assignment whose `=` is at `eq` (None if it has none)."""
    k = eq - 1
    if k >= 0 and tokens[k].text == "+":
        k -= 1
    if k >= 0 and tokens[k].text == "]":
        depth = 0
        while k >= 0:
            if tokens[k].text == "]":
                depth += 1
            elif tokens[k].text == "[":
                depth -= 1
                if depth == 0:
                    break
            k -= 1
        k -= 1
    if k >= 0 and _is_ident(tokens[k].text):
        return k
    return None


class EquationsScope(ModelScope):
    """A model's declarations plus the intermediates its earlier equations defined."""

    def __init__(self, program: Program):
        super().__init__(program)
        self.intermediates: dict[str, TensorType] = {}

    def tensor(self, name: str) -> TensorType | None:
        if name in self.intermediates:
            return self.intermediates[name]
        return super().tensor(name)


def equations_model(program: Program, name: Token, tokens: list[Token], end: Token) -> Model:
    """The model of the equations in `tokens` (one or several)."""
    starts = equation_starts(tokens)
    pieces = [tokens[a:b] for a, b in zip(starts, [*starts[1:], len(tokens)], strict=True)]
    scope = EquationsScope(program)
    builder = GraphBuilder(program)
    outputs: list[TensorDecl] = []
    defined_at: dict[str, Token] = {}
    what = f"MODEL {name.text}"
    for k, piece in enumerate(pieces):
        piece_end = end if k == len(pieces) - 1 else pieces[k + 1][0]
        parser = EquationParser(piece, piece_end, scope, what)
        target = piece[0]
        if len(pieces) > 1 and scope.tensor(target.text) is None and _is_ident(target.text):
            _declare_intermediate(parser, scope, builder, piece, what)
            defined_at[target.text] = target
            eq = parser.parse_equation()
            if eq.scatter is not None or any(ld.tensor == eq.target for ld in loads(eq.rhs)):
                raise target.error(f"{target.text} is an intermediate of {name.text}: define it with =, "
                                   "reading only other tensors",
                                   "+= and scatters add into a declared tensor's prior contents")
            builder.add_node(eq, target)
            continue
        eq = parser.parse_equation()
        decl = program.tensors[eq.target].decl
        builder.store(decl, eq, target)
        outputs.append(decl)
    read = set().union(*(node_reads(eq) for eq in builder.nodes))
    for inter, tok in defined_at.items():
        if inter not in read:
            raise tok.error(f"intermediate {inter} is never read by a later equation of {name.text}",
                            "declare it with TENSOR: to make it an output")
    return builder.finish(name.text, "equation", outputs)


def _declare_intermediate(parser: EquationParser, scope: EquationsScope, builder: GraphBuilder,
                          piece: list[Token], what: str) -> None:
    """Give the undeclared target of `piece` its extents, from the index variables of its left side."""
    target = piece[0]
    if parser.index_var(target) is not None:
        raise target.error(f"{target.text} is an index variable; name the intermediate otherwise")
    extents: list[str] = []
    if len(piece) > 1 and piece[1].text == "[":
        for tok in piece[2:]:
            if tok.text == "]":
                break
            var = parser.index_var(tok)
            if var is None:
                raise tok.error(f"{tok.text!r} is not an index variable: an intermediate's left side names "
                                f"its elements by index variables, whose extents become its shape")
            extents.append(var.extent)
    elif len(piece) < 2 or piece[1].text not in ("=", "+"):
        raise HabuError(f"unknown tensor {target.text} in {what}", target.span,
                        ("a name defined by an equation and read by a later one is an intermediate: "
                         f"{target.text}[r n] = ...",))
    scope.intermediates[target.text] = TensorType(target.text, target.text, tuple(extents), None)
    builder.intermediates[target.text] = TensorDecl(target.text, tuple(extents), None)
