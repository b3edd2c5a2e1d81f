"""Parsing and type-checking equations: `O[m n] = Σ k A[ IX[m] k ] · B[n k]`.

Index variables take their extent type from their name: `m`, `m2` and `m'` range over `#M`. Each
index position of a tensor has an extent type, and an index of another extent does not fit:
`A[k m]` against `A ( #M #K )` fails, naming both extents. The parser produces typed IR directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol

from habu.errors import HabuError
from habu.spec.conditions import ConditionParsing, _is_ident, _is_whole, softmax_along  # noqa: F401
from habu.spec.equation_text import (  # noqa: F401 (the printers, imported from here too)
    format_affine,
    format_compare,
    format_const,
    format_equation,
    format_expr,
    format_index,
)
from habu.spec.functions import CALLABLE, FUNCTIONS
from habu.spec.ir import (
    Const,
    Equation,
    Expr,
    Gather,
    IndexConst,
    IndexExpr,
    IndexVar,
    Load,
    NegInf,
    Op,
    Reduce,
    Size,
    free_vars,
    index_free_vars,
)
from habu.spec.lexer import Token

MAX_DEPTH = 100  # nesting of parentheses, calls and reductions
MAX_POWER = 16
MAX_CONST = Fraction(10) ** 38
MAX_EXPONENT = 400  # `1e99999999` would take minutes to make exact; 1e-400 is still exact and small
_EXPONENT = re.compile(r"[eE]([+-]?\d+)$")


def decimal_exponent(text: str) -> int | None:
    """The exponent written in a number like `1.5e-3` (None when there is none), read without
    making the number (its digit count is bounded by the token length)."""
    m = _EXPONENT.search(text)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class TensorType:
    """What the checker needs to know of a tensor named in an equation."""

    ir_name: str  # the name the IR uses
    shown: str  # the name errors use
    extents: tuple[str, ...]
    range: str | None  # index tensors: the extent their values index into


class Scope(Protocol):
    """Name resolution for an equation: a model's declarations, or a word's extent variables."""

    def extent_of_index(self, name: str) -> str | None: ...
    def tensor(self, name: str) -> TensorType | None: ...
    def extent(self, name: str) -> str | None: ...  # '#M' -> 'M'
    def extent_size(self, extent: str) -> int | None: ...
    def show_extent(self, extent: str) -> str: ...
    def scalar(self, name: str) -> Expr | None: ...  # a bare name with a scalar meaning


def index_base(name: str) -> list[str]:
    """Candidate extent names for an index variable name, best first: `m2` -> ['m2', 'm']."""
    out = [name]
    base = name.rstrip("'")
    if base != name:
        out.append(base)
    stripped = base.rstrip("0123456789")
    if stripped and stripped != base:
        out.append(stripped)
    return out


class EquationParser(ConditionParsing):
    """A recursive-descent parser over the tokens of one equation."""

    def __init__(self, tokens: list[Token], end: Token, scope: Scope, what: str):
        self.toks = tokens
        self.end = end
        self.i = 0
        self.scope = scope
        self.what = what
        self.bound: dict[str, IndexVar] = {}
        self.depth = 0
        self.first_use: dict[IndexVar, Token] = {}

    # -- token helpers
    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def at(self, *texts: str) -> bool:
        t = self.peek()
        return t is not None and t.text in texts

    def take(self) -> Token:
        t = self.peek()
        if t is None:
            raise self.end.error(f"{self.what} ends too early: expected more before ;")
        self.i += 1
        return t

    def expect(self, text: str, context: str) -> Token:
        t = self.peek()
        if t is None:
            raise self.end.error(f"expected {text!r} {context}, found ;")
        if t.text != text:
            raise t.error(f"expected {text!r} {context}, found {t.text!r}")
        self.i += 1
        return t

    def enter(self, tok: Token) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise tok.error(f"expression nested too deeply (more than {MAX_DEPTH} levels)")

    def leave(self) -> None:
        self.depth -= 1

    # -- the equation
    def parse_equation(self, accumulate_allowed: bool = True) -> Equation:
        """`T[lhs] = rhs`, `T[lhs] += rhs` (the target keeps its prior contents and `rhs` is added),
        or a scatter `T[IX[r] n] += rhs` (an index tensor on the left: duplicates accumulate)."""
        target_tok = self.take()
        if not _is_ident(target_tok.text):
            raise target_tok.error(f"an equation starts with the tensor it defines, found {target_tok.text!r}")
        tt = self.scope.tensor(target_tok.text)
        if tt is None:
            raise target_tok.error(f"unknown tensor {target_tok.text}", *self._did_you_mean_tensor())
        if tt.range is not None:
            raise target_tok.error(f"{tt.shown} is an index tensor; an equation cannot define it")
        store: list[IndexExpr] = []  # the stored element's indices, as written
        domain: list[IndexVar] = []  # the left side's index variables, in order
        first_gather: Token | None = None
        if self.at("["):
            self.take()
            while not self.at("]"):
                tok = self.take()
                if tok.text == "=" or tok.text == ";":
                    raise tok.error(f"missing ] after the indices of {tt.shown}")
                pos = len(store)
                # a name followed by [ is a gather, also where an extent makes it a variable too (GROUPS E of #E)
                if _is_ident(tok.text) and self.at("[") and (self.index_var(tok) is None
                                                             or self.scope.tensor(tok.text) is not None):
                    store.append(self.store_gather(tok, tt, pos, domain))
                    first_gather = first_gather or tok
                    continue
                var = self.index_var(tok)
                if var is None:
                    raise tok.error(f"{tok.text!r} is not an index variable: the left side names each "
                                    f"element of {tt.shown} by index variables", *self._index_hint(tt, pos))
                if var.name in self.bound:
                    raise tok.error(f"index {var.name} appears twice on the left side")
                if pos < len(tt.extents) and var.extent != tt.extents[pos]:
                    raise self.extent_mismatch(tok, tt, pos, var.extent)
                self.bound[var.name] = var
                store.append(var)
                domain.append(var)
            self.take()
        if len(store) != len(tt.extents):
            raise target_tok.error(
                f"{tt.shown} has {len(tt.extents)} extents ({self._shape(tt)}) but the left side gives "
                f"{len(store)} indices")
        accumulate = self.assignment(target_tok, tt, first_gather, accumulate_allowed)
        rhs = self.expr()
        if self.peek() is not None:
            t = self.peek()
            assert t is not None
            raise t.error(f"unexpected {t.text!r}: expected an operator or ;")
        for v in free_vars(rhs) - set(domain):
            raise self.first_use[v].error(
                f"index {v.name} is free on the right side: sum over it (Σ {v.name} ...) or index "
                f"{tt.shown} by it")
        lhs = tuple(domain)
        if first_gather is not None:
            return Equation(tt.ir_name, lhs, rhs, scatter=tuple(store))
        if accumulate:  # `T[v] += e` is `T[v] = T[v] + e`: an in-place update of each element
            return Equation(tt.ir_name, lhs, Op("add", (Load(tt.ir_name, lhs), rhs)))
        return Equation(tt.ir_name, lhs, rhs)

    def store_gather(self, tok: Token, tt: TensorType, pos: int, domain: list[IndexVar]) -> Gather:
        """`IX[r]` at position `pos` of the left side: the element stored to is IX's value there."""
        it = self.scope.tensor(tok.text)
        if it is None:
            raise tok.error(f"unknown index tensor {tok.text}")
        if it.range is None:
            raise tok.error(f"{it.shown} is not an index tensor, so it cannot index the left side",
                            "a scatter store names an index tensor: Y[IX[r] n] += ...")
        inner = self.indices(tok, it)
        if len(inner) != 1 or not isinstance(inner[0], IndexVar):
            raise tok.error(f"the left side's gather {it.shown}[...] takes one index variable, like "
                            f"{it.shown}[{(it.extents[0].lower() if it.extents else 'r')}]",
                            "no kernel scatters through a gather of a gather, a constant or several indices")
        var = inner[0]
        if var.name in self.bound:
            raise tok.error(f"index {var.name} appears twice on the left side")
        if pos < len(tt.extents) and it.range != tt.extents[pos]:
            want = self.scope.show_extent(tt.extents[pos])
            raise tok.error(f"{tt.shown}'s index {pos + 1} is over {want}, but the values of {it.shown} "
                            f"index {self.scope.show_extent(it.range)}",
                            f"{tt.shown} is declared ( {self._shape(tt)} )")
        self.bound[var.name] = var
        domain.append(var)
        return Gather(it.ir_name, inner)

    def assignment(self, target_tok: Token, tt: TensorType, gather: Token | None, allowed: bool) -> bool:
        """Take `=` or `+=`; True for `+=`."""
        if gather is not None and not allowed:
            raise gather.error(f"{self.what} defines every element of its output; a scatter store "
                               "(an index tensor on the left side) belongs in a MODEL's equation")
        t = self.peek()
        if t is not None and t.text == "+" and self._next_is("=", 1):
            plus = self.take()
            eq = self.take()
            if eq.span.offset != plus.span.offset + 1:
                raise plus.error("write += without a space between + and =")
            if not allowed:
                raise plus.error(f"{self.what} defines its output with =; += belongs in a MODEL's equation")
            return True
        eq_tok = self.expect("=", f"after {target_tok.text}[...]")
        if gather is not None:
            name = gather.text
            raise eq_tok.error(
                f"a store through {name} with = is ill-defined: {name} may hold one index several times, "
                f"and then several values would be written to one element of {tt.shown}",
                f"write += to add every value into {tt.shown} (duplicate indices accumulate)")
        return False

    def parse_scalar(self) -> Expr:
        """A bare expression (the body of an elementwise word)."""
        e = self.expr()
        if self.peek() is not None:
            t = self.peek()
            assert t is not None
            raise t.error(f"unexpected {t.text!r}: expected an operator or ;")
        return e

    # -- expressions
    def expr(self) -> Expr:
        left = self.term()
        while self.at("+", "-", "−"):
            op = self.take()
            right = self.term()
            left = Op("add" if op.text == "+" else "sub", (left, right))
        return left

    def term(self) -> Expr:
        left = self.unary()
        while self.at("*", "·", "×", "/"):
            op = self.take()
            right = self.unary()
            left = Op("div" if op.text == "/" else "mul", (left, right))
        return left

    def unary(self) -> Expr:
        t = self.peek()
        if t is None:
            raise self.end.error(f"{self.what} ends too early: expected a value before ;")
        if t.text in ("-", "−"):
            self.take()
            if self._infinity(self.peek()):
                self.take()
                return NegInf()
            self.enter(t)
            inner = self.unary()
            self.leave()
            if isinstance(inner, Const):
                return Const(-inner.value)
            return Op("neg", (inner,))
        if t.text == "Σ" or (t.text in ("sum", "max") and not self._next_is("(", 1)):
            return self.reduction()
        return self.power()

    def reduction(self) -> Expr:
        op_tok = self.take()
        op = "sum" if op_tok.text in ("Σ", "sum") else "max"
        self.enter(op_tok)
        new: list[IndexVar] = []
        while True:
            t = self.peek()
            if t is None or not _is_ident(t.text) or t.text in CALLABLE:
                break
            if self._next_is("[", 1) and self.scope.tensor(t.text) is not None:
                break  # `Σ A[...]`: no index (caught below); `Σ j [j ≤ i] · x` is a bracket after j
            var = self.index_var(t)
            if var is None:
                break
            self.take()
            if var.name in self.bound:
                raise t.error(f"index {var.name} is already bound; name another index over "
                              f"{self.scope.show_extent(var.extent)} ({var.name}' or {var.name}2)")
            new.append(var)
            self.bound[var.name] = var
        if not new:
            t = self.peek() or self.end
            raise t.error(f"{op_tok.text} needs the index variables it reduces over, e.g. {op_tok.text} k ...")
        body = self.term()
        for v in new:
            del self.bound[v.name]
        self.leave()
        return Reduce(op, tuple(new), body)

    def power(self) -> Expr:
        base = self.primary()
        while self.at("^", "²"):
            t = self.take()
            if t.text == "²":
                n = 2
            else:
                nt = self.take()
                if not _is_whole(nt.text) or not 1 <= int(nt.text) <= MAX_POWER:
                    raise nt.error(f"^ takes a whole exponent from 1 to {MAX_POWER}")
                n = int(nt.text)
            result = base
            for _ in range(n - 1):
                result = Op("mul", (result, base))
            base = result
        return base

    def primary(self) -> Expr:
        t = self.take()
        if self._infinity(t):
            raise t.error("only −∞ is a value (the identity of a max reduction: max j where(j ≤ i, x, −∞))")
        if t.text == "[":  # an Iverson bracket: [j ≤ i] is 1 where it holds, else 0
            self.enter(t)
            cond = self.condition(t)
            self.expect("]", "to close [ of a condition")
            self.leave()
            return cond
        if t.text == "(":
            self.enter(t)
            e = self.expr()
            self.expect(")", "to close (")
            self.leave()
            return e
        if t.text[0].isdigit() or t.text[0] == ".":
            return self.number(t)
        if t.text.startswith("#"):
            ext = self.scope.extent(t.text)
            if ext is None:
                raise t.error(f"unknown extent {t.text}")
            return Size(ext)
        if not _is_ident(t.text):
            raise t.error(f"expected a value, found {t.text!r}")
        if t.text.startswith("softmax_") and self.at("("):
            return self.softmax(t)
        if self.at("("):
            return self.call(t)
        if self.at("["):
            return self.access(t)
        scalar = self.scope.scalar(t.text)
        if scalar is not None:
            return scalar
        tt = self.scope.tensor(t.text)
        if tt is not None:
            if tt.extents:
                raise t.error(f"{tt.shown} has extents ({self._shape(tt)}): index it, e.g. "
                              f"{t.text}[{' '.join(e.lower() for e in tt.extents)}]")
            return self.access(t, bare=True)
        if self.index_var(t) is not None:
            raise t.error(f"index {t.text} cannot be used as a number")
        raise t.error(f"unknown name {t.text}", *self._did_you_mean_tensor())

    def number(self, t: Token) -> Const:
        exponent = decimal_exponent(t.text)
        if exponent is not None and abs(exponent) > MAX_EXPONENT:
            raise t.error(f"number {t.text} is out of range (a decimal exponent is at most {MAX_EXPONENT})")
        try:
            value = Fraction(t.text.replace("_", ""))
        except (ValueError, ZeroDivisionError):
            raise t.error(f"malformed number {t.text!r}") from None
        if abs(value) > MAX_CONST:
            raise t.error(f"number {t.text} is too large (at most 1e38)")
        return Const(value)

    def call(self, name: Token) -> Expr:
        if name.text not in CALLABLE:
            if name.text in ("sum", "Σ"):
                raise name.error("sum is a reduction: write sum k expr")
            known = ", ".join(sorted(CALLABLE))
            raise name.error(f"unknown function {name.text}", f"the functions are {known}")
        fn = FUNCTIONS[name.text]
        self.enter(name)
        self.take()  # (
        args: list[Expr] = []
        if name.text == "where":
            args.append(self.condition(name))
            for _ in range(2):
                self.expect(",", "after an argument of where(cond, x, y)")
                args.append(self.expr())
        elif not self.at(")"):
            args.append(self.expr())
            while self.at(","):
                self.take()
                args.append(self.expr())
        self.expect(")", f"to close {name.text}(")
        self.leave()
        if len(args) != fn.arity:
            raise name.error(f"{name.text} takes {fn.arity} argument{'s' if fn.arity > 1 else ''}, "
                             f"given {len(args)}")
        return Op(fn.name, tuple(args))

    def access(self, name: Token, bare: bool = False) -> Expr:
        tt = self.scope.tensor(name.text)
        if tt is None:
            if self.index_var(name) is not None:
                raise name.error(f"{name.text} is an index variable, not a tensor")
            raise name.error(f"unknown tensor {name.text}", *self._did_you_mean_tensor())
        if tt.range is not None:
            raise name.error(f"{tt.shown} is an index tensor: its values index other tensors "
                             f"(write X[{tt.shown}[...] ...])")
        indices = () if bare else self.indices(name, tt)
        return Load(tt.ir_name, indices)

    def indices(self, name: Token, tt: TensorType) -> tuple[IndexExpr, ...]:
        self.enter(name)
        self.take()  # [
        out: list[IndexExpr] = []
        while not self.at("]"):
            t = self.peek()
            if t is None:
                raise self.end.error(f"missing ] after the indices of {tt.shown}")
            if t.text in ("=", ")", "(", ",") or (t.text in "+-−*·×/" and len(t.text) == 1):
                raise t.error(f"missing ] after the indices of {tt.shown}")
            pos = len(out)
            ix, extent = self.index_expr()
            if pos < len(tt.extents):
                want = tt.extents[pos]
                if isinstance(ix, IndexConst):
                    size = self.scope.extent_size(want)
                    if ix.value != 0 and (size is None or ix.value >= size):
                        raise t.error(f"constant index {ix.value} into {self.scope.show_extent(want)} "
                                      f"(size {size if size is not None else 'known at run time'}) "
                                      "may be out of bounds")
                elif extent != want:
                    raise self.extent_mismatch(t, tt, pos, extent)
            out.append(ix)
        self.take()  # ]
        self.leave()
        if len(out) != len(tt.extents):
            raise name.error(f"{tt.shown} has {len(tt.extents)} extents ({self._shape(tt)}) but is "
                             f"indexed with {len(out)}")
        return tuple(out)

    def index_expr(self) -> tuple[IndexExpr, str | None]:
        t = self.take()
        if _is_whole(t.text):
            return IndexConst(int(t.text)), None
        if not _is_ident(t.text):
            raise t.error(f"expected an index, found {t.text!r}")
        if self.at("["):
            tt = self.scope.tensor(t.text)
            if tt is None:
                raise t.error(f"unknown index tensor {t.text}")
            if tt.range is None:
                raise t.error(f"{tt.shown} is not an index tensor, so it cannot index another tensor",
                              "declare index maps with ITENSOR:")
            inner = self.indices(t, tt)
            return Gather(tt.ir_name, inner), tt.range
        var = self.index_var(t)
        if var is None:
            tt = self.scope.tensor(t.text)
            if tt is not None:
                raise t.error(f"{tt.shown} used as an index without [...]")
            raise t.error(f"{t.text!r} is not an index variable of any extent")
        if var.name not in self.bound:
            self.first_use.setdefault(var, t)
        return self.bound.get(var.name, var), var.extent

    def index_var(self, t: Token) -> IndexVar | None:
        if t.text in self.bound:
            return self.bound[t.text]
        if not _is_ident(t.text) or t.text.startswith("#"):
            return None
        for base in index_base(t.text):
            ext = self.scope.extent_of_index(base)
            if ext is not None:
                return IndexVar(t.text, ext)
        return None

    # -- messages
    def extent_mismatch(self, tok: Token, tt: TensorType, pos: int, got: str | None) -> HabuError:
        want = self.scope.show_extent(tt.extents[pos])
        have = self.scope.show_extent(got) if got else "?"
        return tok.error(f"{tt.shown}'s index {pos + 1} is over {want}, but {tok.text} ranges over {have}",
                         f"{tt.shown} is declared ( {self._shape(tt)} )")

    def _index_hint(self, tt: TensorType, pos: int) -> tuple[str, ...]:
        """A note naming a variable for index `pos` of `tt`: variables are named after their extent."""
        if pos >= len(tt.extents):
            return ()
        ext = tt.extents[pos]
        base = ext.lower()
        if self.scope.extent_of_index(base) != ext:
            return ()
        names = f"{base}" if base not in self.bound else f"{base}' or {base}2"
        return (f"an index variable is named after its extent: index {pos + 1} of {tt.shown} is over "
                f"{self.scope.show_extent(ext)}, so {names} would do",)

    def _shape(self, tt: TensorType) -> str:
        return " ".join(self.scope.show_extent(e) for e in tt.extents)

    def _did_you_mean_tensor(self) -> tuple[str, ...]:
        return ()

    def _next_is(self, text: str, k: int) -> bool:
        t = self.peek(k)
        return t is not None and t.text == text


def check_index_vars_used(eq: Equation) -> set[IndexVar]:
    """LHS variables that the right side never reads (the result is broadcast along them)."""
    used: set[IndexVar] = set()
    from habu.spec.ir import loads

    for ld in loads(eq.rhs):
        for ix in ld.indices:
            used |= index_free_vars(ix)
    return set(eq.lhs) - used
