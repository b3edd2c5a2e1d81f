"""Elementwise functions: one table, one entry each, with its float64 meaning, its meaning over
GF(p) and its derivative side by side.

Over GF(p), + − · and division (by the modular inverse) are exact field operations, so a plan that
reorders them is checked as an identity of rational functions. Every other function (exp, rsqrt,
sqrt, tanh, erf, max, …) is *uninterpreted*: it is modelled as a keyed pseudo-random function of
its argument(s), fresh for every trial.

Derivatives at a tie: max(a, b) passes its gradient to b when a = b, min(a, b) to b, abs to neither
(sign 0 at 0), so max(x, 0) (RELU) has derivative 0 at 0, as torch's relu. They are written with
`step(x)` (1 where x > 0, else 0), which has no derivative rule of its own. Two computations then agree only if they apply the same
function to arguments that agree — the plan may not rely on an identity of exp or of max. Reductions
with `max` are modelled as the symmetric function prod(r − x) (fresh r per trial), which is
order-free and splits into partial reductions combined by multiplication. docs/VERIFY.md states what
the Schwartz–Zippel bound covers under this model.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from habu.spec.ir import Const, Expr, Op

Derivative = Callable[[tuple[Expr, ...], int], Expr]  # (args, which argument) -> d f / d arg


def _c(x: float | int | Fraction) -> Const:
    return Const(Fraction(x))


def _erf(x: np.ndarray) -> np.ndarray:
    # numpy has no erf; scipy's is vectorised where scipy is installed, math.erf elementwise otherwise
    try:
        from scipy.special import erf
    except ImportError:
        return np.vectorize(math.erf, otypes=[np.float64])(x)
    return erf(x)


def _rsqrt(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return 1.0 / np.sqrt(x)


@dataclass(frozen=True)
class Function:
    name: str
    arity: int
    float64: Callable[..., np.ndarray]
    field: str  # "add" "sub" "mul" "div" "div0" "neg" "where": exact; "oracle": uninterpreted
    infix: str | None = None  # how the equation printer writes it
    derivative: Derivative | None = None
    description: str = ""


def _div0(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(np.asarray(b) == 0, 0.0, np.divide(a, np.where(np.asarray(b) == 0, 1.0, b)))


def _step(x: Expr) -> Op:
    return Op("step", (x,))


def _mul(a: Expr, b: Expr) -> Op:
    return Op("mul", (a, b))


FUNCTIONS: dict[str, Function] = {
    f.name: f
    for f in (
        Function("add", 2, np.add, "add", "+", lambda a, i: _c(1), "a + b"),
        Function("sub", 2, np.subtract, "sub", "−", lambda a, i: _c(1 if i == 0 else -1), "a − b"),
        Function("mul", 2, np.multiply, "mul", "·", lambda a, i: a[1 - i], "a · b"),
        Function(
            "div", 2, np.divide, "div", "/",
            lambda a, i: Op("div", (_c(1), a[1])) if i == 0
            else Op("neg", (Op("div", (a[0], _mul(a[1], a[1]))),)),
            "a / b (exact division over GF(p))",
        ),
        # the softmax of a masked row divides by the sum of its weights, which is 0 when every element
        # is masked: that row is 0 (a choice: torch's SDPA gives NaN), in float64, over GF(p) and in
        # the kernels alike. By b: −div0(a, b)·div0(1, b) (= −div0(a, b²), b = 0 included), the function's
        # own value a factor, so that a term summing it against a forward output's other factors reads that
        # output (habu.spec.grad_reuse: attention's D = Σ d dO·O)
        Function(
            "div0", 2, _div0, "div0", None,
            lambda a, i: Op("div0", (_c(1), a[1])) if i == 0
            else Op("neg", (_mul(Op("div0", a), Op("div0", (_c(1), a[1]))),)),
            "a / b, and 0 where b = 0 (a fully masked softmax row is 0)",
        ),
        Function("neg", 1, np.negative, "neg", "−", lambda a, i: _c(-1), "−a"),
        Function("exp", 1, np.exp, "oracle", None, lambda a, i: Op("exp", a), "e^x"),
        Function("log", 1, np.log, "oracle", None, lambda a, i: Op("div", (_c(1), a[0])), "natural log"),
        Function("sqrt", 1, np.sqrt, "oracle", None,
                 lambda a, i: Op("div", (_c(Fraction(1, 2)), Op("sqrt", a))), "square root"),
        Function("rsqrt", 1, _rsqrt, "oracle", None,
                 lambda a, i: _mul(_c(Fraction(-1, 2)), _mul(Op("rsqrt", a), _mul(Op("rsqrt", a), Op("rsqrt", a)))),
                 "1/√x"),  # its derivative in rsqrt alone: a backward that saved rsqrt(x) needs nothing else
        Function("tanh", 1, np.tanh, "oracle", None,
                 lambda a, i: Op("sub", (_c(1), _mul(Op("tanh", a), Op("tanh", a)))), "hyperbolic tangent"),
        Function("erf", 1, _erf, "oracle", None,
                 lambda a, i: _mul(_c(2 / math.sqrt(math.pi)), Op("exp", (Op("neg", (_mul(a[0], a[0]),)),))),
                 "error function"),
        Function("sigmoid", 1, lambda x: 1.0 / (1.0 + np.exp(-x)), "oracle", None,
                 lambda a, i: _mul(Op("sigmoid", a), Op("sub", (_c(1), Op("sigmoid", a)))), "1/(1+e^-x)"),
        Function("abs", 1, np.abs, "oracle", None,
                 lambda a, i: Op("sub", (_step(a[0]), _step(Op("neg", a)))), "|x|"),
        Function("max", 2, np.maximum, "oracle", None,
                 lambda a, i: _step(Op("sub", a)) if i == 0 else Op("sub", (_c(1), _step(Op("sub", a)))),
                 "the larger of a and b"),
        Function("min", 2, np.minimum, "oracle", None,
                 lambda a, i: _step(Op("sub", (a[1], a[0]))) if i == 0
                 else Op("sub", (_c(1), _step(Op("sub", (a[1], a[0]))))),
                 "the smaller of a and b"),
        # the indicator the derivatives of abs, max and min (and of max reductions) are made of; itself
        # piecewise constant, so it has no derivative rule: a model using it cannot be differentiated
        # selection by a condition on indices (its first argument is always a `Compare`, exactly 0 or 1
        # in every domain): exact over GF(p), so a plan may move work across it
        Function("where", 3, lambda c, x, y: np.where(np.asarray(c) != 0, x, y), "where", None,
                 lambda a, i: _c(0) if i == 0 else Op("where", (a[0], _c(1), _c(0)) if i == 1 else (a[0], _c(0), _c(1))),
                 "x where the condition on indices holds, else y"),
        Function("step", 1, lambda x: (np.asarray(x) > 0).astype(np.float64), "oracle", None, None,
                 "1 where x > 0, else 0 (the Heaviside step; not differentiable)"),
    )
}

# the names an equation may call: `exp(x)`, `max(a, b)`, …
CALLABLE = {name for name, f in FUNCTIONS.items() if f.infix is None}

REDUCTIONS = ("sum", "max")
