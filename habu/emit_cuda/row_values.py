"""Per-row values of a row kernel, as the emitter prints them: row constants hoisted out of the column loops
(`RowConstants`: RMSNorm's rsqrt, softmax's 1 / sum, once a row) and the per-column values a pass keeps in
registers for the final pass (`reuse_held`: softmax's exp(x − max)). Marker loads name both in the
expressions the emitter renders (habu/emit_cuda/emit_rows.py)."""

from __future__ import annotations

from fractions import Fraction

from habu.lower.flatten import is_row_axis
from habu.spec.ir import Const, Expr, IndexVar, Load, Op, Reduce, Size

ROW_CONSTANT = "@row:"  # a marker load: a hoisted row constant
HELD = "@held:"  # a marker load: a value an earlier pass kept in registers for this column


def row_only(e: Expr) -> bool:
    """`e` has one value per row: constants, sizes, reductions over the row and loads of a per-row value
    (a saved statistic R1[r] of a backward), no column's load."""
    if isinstance(e, (Const, Size, Reduce)):
        return True
    if isinstance(e, Load):
        return bool(e.indices) and all(isinstance(i, IndexVar) and is_row_axis(i.name) for i in e.indices)
    return isinstance(e, Op) and all(row_only(a) for a in e.args)


class RowConstants:
    """Row constants hoisted out of the column loops: each distinct one is computed once per row,
    after the reductions it reads, and a division by one becomes a product with its reciprocal
    (RMSNorm's rsqrt of the mean square, softmax's 1 / sum). A float rounding choice, like `__expf`:
    the finite-field proof is about the values, the golden check about their rounding."""

    def __init__(self, render) -> None:
        self._render = render
        self._names: dict[str, str] = {}
        self._pending: list[str] = []

    def hoist(self, e: Expr) -> Expr:
        if not isinstance(e, Op):
            return e
        if e.fn == "div" and row_only(e.args[1]) and not row_only(e.args[0]):
            return Op("mul", (self.hoist(e.args[0]), self._constant(Op("div", (Const(Fraction(1)), e.args[1])))))
        if row_only(e):
            return self._constant(e)
        return Op(e.fn, tuple(self.hoist(a) for a in e.args))

    def _constant(self, e: Expr) -> Load:
        text = self._render(e)
        if text not in self._names:
            self._names[text] = f"rc{len(self._names)}"
            self._pending.append(f"  const float {self._names[text]} = {text};  // once per row")
        return Load(ROW_CONSTANT + self._names[text], ())

    def take(self) -> str:
        """The declarations of the constants hoisted since the last call."""
        out, self._pending = self._pending, []
        return "".join(line + "\n" for line in out)


def reuse_held(e: Expr, render, bodies: dict[str, int], used: set[int], room: int) -> Expr:
    """`e` with the subexpressions an earlier pass computed per column (the same C) replaced by its
    kept values, while `room` more are allowed."""
    if not isinstance(e, Op):
        return e
    i = bodies.get(render(e))
    if i is not None and (i in used or len(used) < room):
        used.add(i)
        return Load(f"{HELD}{i}", ())
    return Op(e.fn, tuple(reuse_held(a, render, bodies, used, room) for a in e.args))


# A row maximum's start: −∞, the identity of max, as every other family starts it; a row whose elements are all −∞
# (masked or not) then has the model's maximum, −∞. Before session 65 an unmasked row started at −FLT_MAX (its
# weights exp(x − max) were then 0 where the model's are exp(−∞ − (−∞)) = NaN), and the saved R1 of attention's
# unfused training forward (max j of the masked scores, a tensor: no condition in the row kernel) read −3.4e38 for
# a row with no visible key where the model says −∞.
MAX_INIT = "(-__int_as_float(0x7f800000))"

