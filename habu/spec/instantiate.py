"""Instantiating a word defined by an equation at a use: broadcasting its inputs' extents, binding
its extent variables and tensors, substituting (and folding) its body."""

from __future__ import annotations

from habu.spec.builder import VarNamer
from habu.spec.ir import (
    Compare,
    Const,
    Equation,
    Expr,
    Gather,
    IndexConst,
    IndexExpr,
    IndexVar,
    Load,
    Op,
    Reduce,
    Size,
    fold_ops,
    map_ops,
)
from habu.spec.lexer import Token
from habu.spec.program import Program
from habu.spec.values import (
    TensorValue,
)

MAX_EXPANSION_DEPTH = 64  # nesting of word calls inside word calls
# Words executed while expanding one model or one definition. A definition's size is known before it
# runs (`expansion_size`), so `: W1 ( x -- y ) W0 W0 ;` ... `W16` is refused where it is defined
# instead of running 2^16 words. 20,000 words (at most as many nodes) check in seconds; real models use hundreds.
MAX_EXPANSION = 20_000
MAX_STEPS = MAX_EXPANSION


def _at(tok: Token) -> str:
    """Where a token was read: FILE:LINE:COL."""
    return f"{tok.span.source.path}:{tok.span.line}:{tok.span.col}"


def broadcast(tok: Token, word: str, vals: list[TensorValue], program: Program) -> tuple[str, ...]:
    """NumPy-style broadcasting by extent: equal extents, or a static extent of size 1."""
    rank = max(len(v.extents) for v in vals)
    out: list[str] = []
    for pos in range(rank):
        chosen: str | None = None
        chosen_from: TensorValue | None = None
        for v in vals:
            k = pos - (rank - len(v.extents))
            if k < 0:
                continue
            ext = v.extents[k]
            if chosen is None or (_size_one(program, chosen) and not _size_one(program, ext)):
                chosen, chosen_from = ext, v
            elif ext != chosen and not _size_one(program, ext):
                assert chosen_from is not None
                raise tok.error(f"{word}: extents do not match: #{chosen} in {chosen_from.label} "
                                f"against #{ext} in {v.label}",
                                f"{chosen_from.label} was pushed at {_at(chosen_from.origin)}, "
                                f"{v.label} at {_at(v.origin)}",
                                "extents broadcast only when they are the same extent or one has size 1")
        assert chosen is not None
        out.append(chosen)
    return tuple(out)


def _size_one(program: Program, ext: str) -> bool:
    return program.extents[ext].extent.size == 1


def _aligned_indices(extents: tuple[str, ...], lhs: tuple[IndexVar, ...], program: Program) -> tuple:
    offset = len(lhs) - len(extents)
    out: list[IndexExpr] = []
    for k, ext in enumerate(extents):
        var = lhs[k + offset]
        out.append(var if var.extent == ext else IndexConst(0))
    return tuple(out)


def _substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    def leaf(x: Expr) -> Expr:
        if isinstance(x, Load) and x.tensor in mapping and not x.indices:
            return mapping[x.tensor]
        if isinstance(x, Reduce):
            return Reduce(x.op, x.vars, _substitute(x.body, mapping))
        return x

    return map_ops(e, leaf)


def _substitute_folded(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """`_substitute`, folding the word's own operations on constants (`2 3 +` is 5, not an expression).
    The values substituted in are already folded: they were made by earlier words."""

    def leaf(x: Expr) -> Expr:
        if isinstance(x, Load) and x.tensor in mapping and not x.indices:
            return mapping[x.tensor]
        return x

    return fold_ops(e, leaf, _fold_op)


def _fold_op(e: Op, args: list[Expr]) -> Expr:
    if all(isinstance(a, Const) for a in args):
        vals = [a.value for a in args]  # type: ignore[union-attr]
        if e.fn == "add":
            return Const(vals[0] + vals[1])
        if e.fn == "sub":
            return Const(vals[0] - vals[1])
        if e.fn == "mul":
            return Const(vals[0] * vals[1])
        if e.fn == "neg":
            return Const(-vals[0])
        if e.fn == "div" and vals[1] != 0:
            return Const(vals[0] / vals[1])
    return Op(e.fn, tuple(args))


def _instantiate_ix(ix: IndexExpr, tensors: dict[str, str], binding: dict[str, str],
                    var_map: dict[str, IndexVar], builder: VarNamer) -> IndexExpr:
    if isinstance(ix, IndexVar):
        if ix.name not in var_map:
            var_map[ix.name] = builder(binding.get(ix.extent, ix.extent))
        return var_map[ix.name]
    if isinstance(ix, Gather):
        return Gather(tensors.get(ix.tensor, ix.tensor),
                      tuple(_instantiate_ix(i, tensors, binding, var_map, builder) for i in ix.indices))
    return ix


def _instantiate(e: Expr, tensors: dict[str, str], binding: dict[str, str],
                 var_map: dict[str, IndexVar], builder: VarNamer) -> Expr:
    def leaf(x: Expr) -> Expr:
        if isinstance(x, Load):
            return Load(tensors.get(x.tensor, x.tensor),
                        tuple(_instantiate_ix(i, tensors, binding, var_map, builder) for i in x.indices))
        if isinstance(x, Reduce):
            vars_ = tuple(_instantiate_ix(v, tensors, binding, var_map, builder) for v in x.vars)
            return Reduce(x.op, vars_, _instantiate(x.body, tensors, binding, var_map, builder))  # type: ignore[arg-type]
        if isinstance(x, Size):
            return Size(binding.get(x.extent, x.extent))
        if isinstance(x, Compare):
            return x.map_indices(lambda i: _instantiate_ix(i, tensors, binding, var_map, builder)) \
                .map_extents(lambda name: binding.get(name, name))
        return x

    return fold_ops(e, leaf, lambda o, args: Op(o.fn, tuple(args)))


def _instantiate_eq(eq: Equation, tensors: dict[str, str], binding: dict[str, str],
                    var_map: dict[str, IndexVar], builder: VarNamer) -> Equation:
    lhs = tuple(_instantiate_ix(v, tensors, binding, var_map, builder) for v in eq.lhs)
    rhs = _instantiate(eq.rhs, tensors, binding, var_map, builder)
    return Equation(tensors[eq.target], lhs, rhs)  # type: ignore[arg-type]
