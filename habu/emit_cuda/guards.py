"""A checked kernel set: members guarded by conditions on runtime extents, chosen at call time.

Guards are the text z3's `simplify` prints (`(2*K)%16 == 0`, `And(K%8 == 0, 4 <= M)`). They are
parsed with `ast` and evaluated by a small interpreter over Python ints that admits only extent
names, integer literals, arithmetic, comparisons and the boolean connectives — never `eval`.
Integer `/` and `%` follow z3 (SMT-LIB `div`/`mod`: the remainder is never negative).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from typing import Generic, TypeVar

from habu.emit_cuda.arrays import ArgumentError
from habu.errors import HabuError

T = TypeVar("T")


class GuardError(HabuError):
    """A guard is not an expression Habu evaluates (an internal error: guards come from z3)."""


def z3_div(a: int, b: int) -> int:
    """SMT-LIB integer division: a = b·q + r with 0 <= r < |b|."""
    if b == 0:
        raise GuardError("division by zero in a guard")
    return (a - a % abs(b)) // b


def z3_mod(a: int, b: int) -> int:
    if b == 0:
        raise GuardError("modulo by zero in a guard")
    return a % abs(b)


_ARITH = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
          ast.Div: z3_div, ast.FloorDiv: z3_div, ast.Mod: z3_mod}
_COMPARE = {ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
            ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b}
_CALLS = ("And", "Or", "Not", "Implies", "If")  # the connectives z3 prints as calls


def _check(node: ast.AST, text: str) -> None:
    children: list[ast.expr]
    match node:
        case ast.Constant(value=v) if type(v) in (int, bool):
            children = []
        case ast.Name(id=name) if not name.startswith("_"):
            children = []
        case ast.BinOp(op=op) if type(op) in _ARITH:
            children = [node.left, node.right]
        case ast.UnaryOp(op=ast.Not() | ast.USub() | ast.UAdd()):
            children = [node.operand]
        case ast.BoolOp():
            children = node.values
        case ast.Compare(ops=ops) if all(type(op) in _COMPARE for op in ops):
            children = [node.left, *node.comparators]
        case ast.Call(func=ast.Name(id=fn), keywords=[]) if fn in _CALLS:
            children = node.args
        case _:
            shown = ast.unparse(node) if isinstance(node, ast.expr) else type(node).__name__
            raise GuardError(f"guard {text!r}: {shown!r} is not allowed "
                             "(only extent names, integers, + - * / %, comparisons, and/or/not)")
    for child in children:
        _check(child, text)


def parse_guard(text: str) -> ast.expr:
    """Parse a guard, rejecting anything but the admitted forms."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, RecursionError, MemoryError) as exc:
        raise GuardError(f"cannot parse guard {text!r}: {getattr(exc, 'msg', type(exc).__name__)}") from None
    _check(tree, text)
    return tree


def _eval(node: ast.expr, sizes: Mapping[str, int]) -> int | bool:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in sizes:
            raise GuardError(f"guard names {node.id}, which is not an extent with a known size")
        return int(sizes[node.id])
    if isinstance(node, ast.BinOp):
        return _ARITH[type(node.op)](int(_eval(node.left, sizes)), int(_eval(node.right, sizes)))
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, sizes)
        return (not v) if isinstance(node.op, ast.Not) else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BoolOp):
        values = (_eval(v, sizes) for v in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, sizes)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = _eval(right_node, sizes)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    args = node.args
    name = node.func.id
    if name == "And":
        return all(_eval(a, sizes) for a in args)
    if name == "Or":
        return any(_eval(a, sizes) for a in args)
    if len(args) != {"Not": 1, "Implies": 2, "If": 3}[name]:
        raise GuardError(f"{name} with {len(args)} arguments in a guard")
    if name == "Not":
        return not _eval(args[0], sizes)
    if name == "Implies":
        return (not _eval(args[0], sizes)) or bool(_eval(args[1], sizes))
    return _eval(args[1], sizes) if _eval(args[0], sizes) else _eval(args[2], sizes)


def eval_guard(text: str, sizes: Mapping[str, int]) -> bool:
    """Whether a guard holds for concrete extent sizes."""
    return bool(_eval(parse_guard(text), sizes))


class KernelSet(Generic[T]):
    """Members in order, each with the guards under which it is valid; the first that holds is used."""

    def __init__(self, members: Iterable[tuple[str | Sequence[str], T]]):
        self.members: list[tuple[tuple[str, ...], T]] = []
        self._trees: list[list[ast.expr]] = []
        for guards, member in members:
            gs = (guards,) if isinstance(guards, str) else tuple(guards)
            self._trees.append([parse_guard(g) for g in gs])  # a bad guard fails here, not at call time
            self.members.append((gs, member))
        if not self.members:
            raise GuardError("a kernel set needs at least one member")

    def index(self, sizes: Mapping[str, int]) -> int:
        """The position of the first member whose guards all hold."""
        return self.first_holding(sizes, range(len(self._trees)))

    def first_holding(self, sizes: Mapping[str, int], among: range) -> int:
        """The position of the first member in `among` whose guards all hold, or ArgumentError."""
        for i in among:
            if all(_eval(t, sizes) for t in self._trees[i]):
                return i
        shown = ", ".join(f"{k}={v}" for k, v in sorted(sizes.items()))
        needs = "; ".join(f"member {i} needs {' and '.join(self.members[i][0]) or 'nothing'}" for i in among)
        raise ArgumentError(f"no kernel in the set accepts these sizes ({shown}): {needs}")

    def select(self, sizes: Mapping[str, int]) -> T:
        return self.members[self.index(sizes)][1]

    def __len__(self) -> int:
        return len(self.members)


__all__ = ["GuardError", "KernelSet", "eval_guard", "parse_guard", "z3_div", "z3_mod"]
