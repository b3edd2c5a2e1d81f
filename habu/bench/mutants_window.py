"""Planted windows of attention's backward products (habu/lower/k_bounds.py): k tiles skipped that hold terms the
model does not make zero. The finite-field check runs each tile over its window and kills them; the `k-window` rule
refuses them before it (habu/prove/rules_window.py) — the suite runs the check alone."""

from __future__ import annotations

from dataclasses import replace

from habu.lower import ContractionLowering, Lowering
from habu.lower.k_bounds import KBound, KWindow, Linear

EXAMPLE = "attention.habu"
MODEL = "ATTENTION-GQA:backward"
# 300 queries over 1000 keys: the diagonal crosses the tiles off their corners (offset #J − #I = 700)
SHAPE = {"B": 1, "G": 2, "R": 2, "I": 300, "J": 1000}
PINS: dict[str, str] = {}
# the plan's kernels: 0 the row sum D, 1 the scores with P, 2 dP with dS, 3 dQ, 4 dK.in, 5 dK, 6 dV.in, 7 dV
SCORES, DS, DQ, DK_IN = 1, 2, 3, 4


def _shifted(lin: Linear, by: int) -> Linear:
    return replace(lin, const=lin.const + by)


def _window(lw: Lowering, window: KWindow) -> Lowering:
    assert isinstance(lw, ContractionLowering) and lw.window, "the planted kernel has no window"
    return replace(lw, window=window)


def operand_bound_one_tile_in(lw: Lowering) -> Lowering:
    """Each operand's bound one k tile inside its condition: a tile's last (dQ) or first (dK) k tile of terms
    skipped."""
    assert isinstance(lw, ContractionLowering)
    bk = lw.bk
    bounds = tuple(replace(b, condition=_shifted(b.condition, bk)) for b in lw.window.operands)
    return _window(lw, replace(lw.window, operands=bounds))


def zero_tile_one_tile_early(lw: Lowering) -> Lowering:
    """The stored values' condition one tile row short: the tiles the diagonal crosses counted as zero."""
    assert isinstance(lw, ContractionLowering)
    tiles = tuple(replace(z, condition=_shifted(z.condition, lw.bm)) for z in lw.window.outputs)
    return _window(lw, replace(lw.window, outputs=tiles))


def bound_on_the_other_operand(lw: Lowering) -> Lowering:
    """A bound said of B (K, which the model does not make zero) with A's condition, along n."""
    assert isinstance(lw, ContractionLowering)
    b = lw.window.operands[0]
    lin = Linear(tuple(("n" if v == b.axis else v, c) for v, c in b.condition.terms), b.condition.sizes,
                 b.condition.const)
    return _window(lw, KWindow((KBound(lw.b.tensor, "n", lin),)))


MUTANT_ENTRIES = (
    ("window-dq-bound-one-tile-in", "dQ's k window ends one tile before the causal diagonal", EXAMPLE, MODEL, SHAPE,
     operand_bound_one_tile_in, PINS, DQ),
    ("window-dk-bound-one-tile-in", "dK's k window begins one tile after the causal diagonal", EXAMPLE, MODEL, SHAPE,
     operand_bound_one_tile_in, PINS, DK_IN),
    ("window-scores-zero-tile-early", "the scores' product skips the tiles the causal diagonal crosses", EXAMPLE,
     MODEL, SHAPE, zero_tile_one_tile_early, PINS, SCORES),
    ("window-ds-zero-tile-early", "dP's product skips the tiles the causal diagonal crosses", EXAMPLE, MODEL, SHAPE,
     zero_tile_one_tile_early, PINS, DS),
    ("window-bound-on-the-other-operand", "dQ's k window said of K, which is not zero past the diagonal", EXAMPLE,
     MODEL, SHAPE, bound_on_the_other_operand, PINS, DQ),
)

__all__ = ["MUTANT_ENTRIES"]
