"""The k tiles a contraction's output tile needs, where the model says the rest add zeros.

An operand zero outside a condition that ties k to the tile's rows (habu/spec/support.py: attention's backward's
dS, zero above the causal diagonal, in dQ = `Σ j dS[i j]·K[j e]`) bounds the k tiles of each output tile:

    condition  a·x + b·k + c ≤ 0   (x the tile axis m or n, b = ±1, c the constant and sizes)
    b = +1:  k ≤ −c − a·x      k tiles [.., ⌈(max(0, −c − min a·x + 1)) / BK⌉)
    b = −1:  k ≥ c + a·x       k tiles [⌊max(0, c + min a·x) / BK⌋, ..)

with min a·x over the tile's rows [x0, x0 + BX) (rows past the extent included: a wider window, never a
narrower one). An output whose every element is zero outside a condition on m and n (P's own mask) needs no k
tile where the condition fails on the whole tile: a·m + b·n + c > 0 at its smallest over the tile.

`KWindow.tiles` gives [begin, end) within the split's range; the producer and the consumers of a wgmma kernel
loop over the same range (the emitter prints `kt_begin`, `kt_end` from it, habu/emit_cuda/emit_fma.py
`tile_setup`), the finite-field check runs each tile over its own range, and the `k-window` rule proves with
z3 that every (x, k) a window leaves out fails the condition. Numerators are clamped at 0 first, so C's
division (toward zero) and the floor division of the checks agree."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from habu.lower.access import cdiv, floordiv, maximum, minimum
from habu.lower.conditions import condition_axis
from habu.spec.ir import Compare, Expr, IndexVar, Model
from habu.spec.support import conditions_at, expression_support, supports

TILE_AXES = ("m", "n")


@dataclass(frozen=True)
class Linear:
    """A condition as `Σ coefficient·variable + Σ coefficient·#extent + const ≤ 0`."""

    terms: tuple[tuple[str, int], ...]  # (variable, coefficient), sorted, no zero coefficient
    sizes: tuple[tuple[int, str], ...]
    const: int

    def describe(self) -> str:
        """`k − m + #J − #I ≤ 0`: the condition as it reads (kernel axes, extents with #)."""
        parts = [(c, v) for v, c in self.terms] + [(c, f"#{e}") for c, e in self.sizes]
        text = " ".join(f"{'−' if c < 0 else '+'} {'' if abs(c) == 1 else f'{abs(c)}·'}{x}" for c, x in parts)
        text = text[2:] if text.startswith("+ ") else "−" + text[2:] if text else "0"
        if self.const:
            text += f" {'−' if self.const < 0 else '+'} {abs(self.const)}"
        return f"{text} ≤ 0"

    def coefficient(self, var: str) -> int:
        return dict(self.terms).get(var, 0)

    def offset(self, s: Mapping[str, Any]) -> Any:
        """The constant part at sizes `s` (ints, z3 terms or C expressions)."""
        total: Any = self.const
        for c, e in self.sizes:
            total = total + c * s[e]
        return total


def linear(cond: Compare, rename: Mapping[str, str]) -> Linear | None:
    """`cond` as a `Linear` over its variables renamed by `rename` (a variable not there: None), or None for
    = and ≠."""
    sign, extra = {"le": (1, 0), "lt": (1, 1), "ge": (-1, 0), "gt": (-1, 1)}.get(cond.op, (0, 0))
    if not sign:
        return None
    coefs: dict[str, int] = {}
    sizes: dict[str, int] = {}
    const = extra
    for side, k in ((cond.left, sign), (cond.right, -sign)):
        for c, ix in side.terms:
            if not isinstance(ix, IndexVar) or ix.name not in rename:
                return None
            name = rename[ix.name]
            coefs[name] = coefs.get(name, 0) + k * c
        for c, e in side.sizes:
            sizes[e] = sizes.get(e, 0) + k * c
        const += k * side.const
    return Linear(tuple(sorted((v, c) for v, c in coefs.items() if c)), tuple(sorted((c, e) for e, c in sizes.items() if c)),
                  const)


def _smallest(coef: int, origin: Any, rows: int) -> Any:
    """min coef·x over x in [origin, origin + rows)."""
    return coef * origin if coef >= 0 else coef * (origin + rows - 1)


@dataclass(frozen=True)
class KBound:
    """An operand (`tensor`) zero where `condition` fails; the condition reads k and the tile axis `axis`."""

    tensor: str
    axis: str  # "m" or "n"
    condition: Linear

    @property
    def upper(self) -> bool:
        """The condition bounds k from above (k's coefficient +1), else from below (−1)."""
        return self.condition.coefficient("k") > 0


@dataclass(frozen=True)
class ZeroTile:
    """The output (`tensor`) is zero wherever `condition` over m and n fails, whatever the product."""

    tensor: str
    condition: Linear


@dataclass(frozen=True)
class KWindow:
    """The bounds of a contraction's k tiles by its output tile (empty: every k tile of the split)."""

    operands: tuple[KBound, ...] = ()
    outputs: tuple[ZeroTile, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.operands or self.outputs)

    def tiles(self, begin: Any, end: Any, m0: Any, n0: Any, bm: int, bn: int, bk: int, s: Mapping[str, Any]
              ) -> tuple[Any, Any]:
        """[begin, end) of a split narrowed to the k tiles output tile (m0, n0) may need."""
        origin, rows = {"m": m0, "n": n0}, {"m": bm, "n": bn}
        for b in self.operands:
            a = b.condition.coefficient(b.axis)
            reach = b.condition.offset(s) + _smallest(a, origin[b.axis], rows[b.axis])
            if b.upper:  # k ≤ −reach: tiles before ⌈(1 − reach) / BK⌉
                end = minimum(end, cdiv(maximum(0, 1 - reach), bk))
            else:  # k ≥ reach
                begin = maximum(begin, floordiv(maximum(0, reach), bk))
        if self.outputs:  # a tile whose stored values are all zero runs no k tile
            end = end - self.zero_tile(m0, n0, bm, bn, s) * maximum(0, end - begin)
        return begin, end

    def zero_tile(self, m0: Any, n0: Any, bm: int, bn: int, s: Mapping[str, Any]) -> Any:
        """1 where output tile (m0, n0) is zero whatever the product (some `outputs` condition fails on every
        element: its least value over the tile > 0), else 0: such a tile runs no k tile. (Its epilogue still runs:
        a TMA-store epilogue that stored zeros there without its arithmetic, behind a branch, took attention's
        backward's dP product from 39.4 to 59.8 µs, H100, docs/PERF.md "Session 66".)"""
        origin, rows = {"m": m0, "n": n0}, {"m": bm, "n": bn}
        zero: Any = 0
        for z in self.outputs:
            least = z.condition.offset(s)
            for axis in TILE_AXES:
                least = least + _smallest(z.condition.coefficient(axis), origin[axis], rows[axis])
            zero = maximum(zero, minimum(1, maximum(0, least)))
        return zero


def operand_bound(tensor: str, conditions: Iterable[Compare], rename: Mapping[str, str], axis: str) -> list[KBound]:
    """The bounds on k a support's conditions give (over the operand's variables, `rename` taking each to its
    kernel axis): those that read k with coefficient ±1 and no axis but `axis`."""
    out = []
    for cond in conditions:
        lin = linear(cond, rename)
        if lin is None or abs(lin.coefficient("k")) != 1:
            continue
        if {v for v, _ in lin.terms} <= {"k", axis} and lin.coefficient(axis):
            out.append(KBound(tensor, axis, lin))
    return out


def zero_tiles(tensor: str, conditions: Iterable[Compare], rename: Mapping[str, str]) -> list[ZeroTile]:
    """The conditions on m and n outside which an output is zero."""
    out = []
    for cond in conditions:
        lin = linear(cond, rename)
        if lin is not None and lin.terms and {v for v, _ in lin.terms} <= set(TILE_AXES):
            out.append(ZeroTile(tensor, lin))
    return out


def k_window(model: Model, product: Any, axis_of: Mapping[IndexVar, str], stored: Iterable[Expr], output: str
             ) -> KWindow:
    """The window of a contraction kernel: the bounds its operands' supports give (`product`, the
    habu.plan.patterns.Contraction; `axis_of` each of its variables' kernel axis), and the conditions every value
    it stores (`stored`, over the kernel's axes and the epilogue's loads; `output` the chain's end) is zero outside."""
    found = supports(model)
    rename = {v.name: axis for v, axis in axis_of.items()}
    operands: list[KBound] = []
    for operand, axis in ((product.a, "m"), (product.b, "n")):
        load = operand.load
        conds = found.get(load.tensor)
        if conds and all(isinstance(ix, IndexVar) for ix in load.indices):
            operands += operand_bound(load.tensor, conditions_at(conds, load.indices), rename, axis)
    shared: frozenset[Compare] | None = None
    for value in stored:
        conds = expression_support(value, found)
        conds = frozenset() if conds is None else conds  # (a stored constant 0: no condition to share)
        shared = conds if shared is None else shared & conds
    on_axes = {axis: axis for axis in TILE_AXES} | {condition_axis(axis): axis for axis in TILE_AXES}
    outputs = zero_tiles(output, sorted(shared or (), key=repr), on_axes)
    return KWindow(tuple(operands), tuple(outputs))


def scheduled_window(window: KWindow, kernel: Any) -> KWindow:
    """The window a schedule keeps: none unless the plan skips zero terms (`skip_zero`), none under a cluster split
    (its blocks meet in one cluster); under B's multicast to a cluster of tiles along m, only the bounds by n (the
    cluster's blocks load the same k tiles of B)."""
    if not window or not kernel.skip_zero:
        return NO_WINDOW
    if kernel.split_k > 1 and kernel.split_reduce == "cluster":
        return NO_WINDOW
    if kernel.cluster_m > 1:
        return KWindow(tuple(b for b in window.operands if b.axis == "n"))
    return window


NO_WINDOW = KWindow()

__all__ = ["NO_WINDOW", "KBound", "KWindow", "Linear", "ZeroTile", "k_window", "linear", "operand_bound",
           "scheduled_window", "zero_tiles"]
