"""Conditions on indices and the softmax along an index, for the equation parser: `j ≤ i + #J − #I`,
`j < LEN[b]`, `[j ≤ i]`, `where(c, x, y)`'s condition, `−∞`, `softmax_j(x)`.

`ConditionParsing` is a part of `EquationParser` (habu.spec.equation): its methods use the parser's
token helpers (peek, at, take, expect, enter, leave), its bound indices and its scope.
"""

from __future__ import annotations

from fractions import Fraction

from habu.spec.ir import (
    Compare,
    Const,
    Expr,
    IndexAffine,
    IndexExpr,
    IndexVar,
    NegInf,
    Op,
    Reduce,
    rename_vars,
)
from habu.spec.lexer import Token


class ConditionParsing:
    """The parser's methods for conditions and softmax_j (mixed into EquationParser)."""

    def softmax(self, name: Token) -> Expr:
        """`softmax_j(x)` (see `softmax_along`): the softmax runs along the bound index j (a reduction
        around it sums over j)."""
        var_name = name.text[len("softmax_"):]
        var = self.bound.get(var_name)
        if var is None:
            raise name.error(f"{name.text}(...) normalises along index {var_name or '?'}, which no reduction "
                             "around it binds", "write Σ j softmax_j(x[i j]) · v[j d]")
        self.enter(name)
        self.take()  # (
        x = self.expr()
        self.expect(")", f"to close {name.text}(")
        self.leave()
        return softmax_along(x, var, [self._fresh(var, k) for k in range(3)])

    def _fresh(self, var: IndexVar, k: int) -> IndexVar:
        """An index over var's extent named like no bound index: j', j'', ... (k-th of them)."""
        name = var.name
        found = 0
        while True:
            name += "'"
            if name not in self.bound:
                if found == k:
                    return IndexVar(name, var.extent)
                found += 1

    # -- conditions on indices: `j ≤ i + #J − #I`, `j < LEN[b]`
    def condition(self, at: Token) -> Compare:
        """`affine op affine`, op one of < ≤ <= > ≥ >= = ≠; both sides are index arithmetic."""
        start = self.peek() or self.end
        left = self.affine(at)
        op_tok = self.peek()
        op = self._comparison()
        if op is None:
            found = repr(op_tok.text) if op_tok is not None else ";"
            raise (op_tok or self.end).error(
                f"expected a comparison (< ≤ > ≥ = ≠) of indices after {start.text!r}, found {found}",
                "a condition compares index expressions: where(j ≤ i, x, y), [j < LEN[b]]")
        right = self.affine(at)
        cmp = Compare(op, left, right)
        if not cmp.index_exprs():
            raise start.error("this condition compares constants and extent sizes only: it names no index")
        return cmp

    def _comparison(self) -> str | None:
        t = self.peek()
        if t is None:
            return None
        two = {"<": "le", ">": "ge"}
        if t.text in two and self._next_is("=", 1) and self.peek(1).span.offset == t.span.offset + 1:  # type: ignore[union-attr]
            self.i += 2
            return two[t.text]
        ops = {"<": "lt", "≤": "le", ">": "gt", "≥": "ge", "=": "eq", "≠": "ne"}
        if t.text in ops:
            self.i += 1
            return ops[t.text]
        return None

    def affine(self, at: Token) -> IndexAffine:
        """`±term ± term ...`, each term an index variable, a gather `LEN[b]`, an extent size `#J`
        or a whole number."""
        terms: list[tuple[int, IndexExpr]] = []
        sizes: list[tuple[int, str]] = []
        const = 0
        sign = 1
        if self.at("-", "−"):
            self.take()
            sign = -1
        while True:
            t = self.peek()
            if t is None:
                raise self.end.error("a condition ends too early: expected an index, #EXTENT or a number")
            if _is_whole(t.text):
                self.take()
                const += sign * int(t.text)
            elif t.text.startswith("#"):
                self.take()
                ext = self.scope.extent(t.text)
                if ext is None:
                    raise t.error(f"unknown extent {t.text}")
                sizes.append((sign, ext))
            elif _is_ident(t.text):
                tt = self.scope.tensor(t.text)
                if tt is not None and tt.range is None:
                    raise t.error(f"{tt.shown} holds values, not indices: a condition compares index "
                                  "expressions (index variables, index tensors, #EXTENT sizes, numbers)",
                                  "where(cond, x, y) takes such a condition first: where(j ≤ i, x, y)")
                ix, _ = self.index_expr()
                terms.append((sign, ix))
            else:
                raise t.error(f"expected an index, #EXTENT or a whole number in a condition, found {t.text!r}")
            if self.at("+"):
                self.take()
                sign = 1
            elif self.at("-", "−"):
                self.take()
                sign = -1
            else:
                return IndexAffine(tuple(terms), tuple(sizes), const)

    def _infinity(self, t: Token | None) -> bool:
        return t is not None and t.text == "∞"


def softmax_along(x: Expr, var: IndexVar, fresh: list[IndexVar]) -> Expr:
    """exp(x − max j1 x1) / Σ j2 exp(x2 − max j3 x3), xk being x at jk (`fresh`: j1, j2, j3).
    A masked argument `where(c, s, −∞)` keeps its mask on the weights, where(c, exp(s − m), 0): in
    float64 that is what exp(−∞) = 0 gives; over GF(p), where exp(−∞) has no such value, it is
    what makes masked elements weigh nothing there too. A masked softmax divides with `div0`, so a
    row whose every element is masked is 0 in every domain and in the kernels (SDPA gives NaN)."""
    masked = isinstance(x, Op) and x.fn == "where" and isinstance(x.args[2], NegInf)

    def at(v: IndexVar) -> Expr:
        return rename_vars(x, {var: v}) if v != var else x

    def weight(v: IndexVar, w: IndexVar) -> Expr:
        e = Op("exp", (Op("sub", (at(v), Reduce("max", (w,), at(w)))),))
        if masked:
            cond = at(v).args[0]  # type: ignore[union-attr]
            return Op("where", (cond, e, Const(Fraction(0))))
        return e

    # a fully masked row's weights sum to 0: div0 makes that row 0 (SDPA's NaN is not kept)
    return Op("div0" if masked else "div", (weight(var, fresh[0]), Reduce("sum", (fresh[1],), weight(fresh[1], fresh[2]))))


def _is_whole(text: str) -> bool:
    """Decimal digits only: `'²'.isdigit()` is True in Python, but `int('²')` raises."""
    return text.isascii() and text.isdigit()


def _is_ident(text: str) -> bool:
    return bool(text) and (text[0].isalpha() or text[0] == "_") and text[0] != "Σ"
