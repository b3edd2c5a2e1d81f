"""The rule of a contraction whose k loop skips tiles the model makes zero (`ContractionLowering.window`,
habu/lower/k_bounds.py): every term a tile leaves out is zero.

For every block's split and tile, every output element (m, n) of the tile inside the extents and every k of the
split's range outside the tile's window, the dropped term A[m k]·B[n k] is zero by the model: one operand's
condition fails at (m, k) or (n, k), or a condition every stored value is zero outside fails at (m, n). z3
proves it over all tiles and elements, at symbolic runtime extents within their domain, through the very
formulas the emitter prints (`tile_k_range`). The conditions are the model's (habu/spec/support.py), evaluated
as it writes them (`condition_formula`) at the operand's or the stored values' coordinates; the window's own normal
form (`KBound.condition`) is not read, so a window whose bound is planted wrong, or said of the wrong operand, is
refused. The finite-field check then runs each tile over its window (habu/prove/window_terms.py)."""

from __future__ import annotations

from collections.abc import Iterator

import z3

from habu.lower.conditions import condition_axis
from habu.lower.contraction import ContractionLowering
from habu.prove.conditions import condition_formula
from habu.prove.obligation import Context, Obligation, Rule
from habu.spec.support import POSITION, expression_support, supports

WINDOW_RULES = {r.name: r for r in (
    Rule("k-window", "the k tiles a contraction's output tile skips hold only terms the model makes zero",
         "habu/spec/support.py (where a node is zero); FlashAttention's causal skip of tiles above the diagonal"),
)}


def window_obligations(name: str, lw: ContractionLowering, ctx: Context) -> Iterator[Obligation]:
    window = lw.window
    if not window:
        return
    s = ctx.ext
    split, tm, tn, m, n, k = (z3.Int(f"{name}.{v}") for v in ("split", "tm", "tn", "m", "n", "k"))
    b0, e0 = lw.k_range(split, s)
    begin, end = lw.tile_k_range(split, s, tm, tn)
    m0, n0 = lw.tile_origin(tm, tn)
    inside = z3.And(split >= 0, split < lw.kernel.split_k, tm >= 0, tm < lw.tiles_m(s), tn >= 0, tn < lw.tiles_n(s),
                    m >= m0, m < m0 + lw.bm, m < s[lw.m], n >= n0, n < n0 + lw.bn, n < s[lw.n],
                    k >= b0 * lw.bk, k < e0 * lw.bk, k < s[lw.k], k >= 0)
    skipped = z3.Or(k < begin * lw.bk, k >= end * lw.bk)
    at = {"m": m, "n": n, "k": k, **{a: z3.Int(f"{name}.{a}") for a in lw.batch_axes}}
    found = supports(ctx.model)

    def zero_outside(conds, named) -> z3.BoolRef:  # some condition fails at the coordinates `named`
        return z3.Not(z3.And(*(condition_formula(cond, named, s, {}) for cond in conds)))

    # the operands as the model reads them: a staged copy (`@T`, habu/lower/staging.py) holds T's values
    operands = (lw.a_src or lw.a, lw.b_src or lw.b)
    zero = [zero_outside(found[acc.tensor], {f"{POSITION}{p}": at[pos.axis] for p, pos in enumerate(acc.positions)})
            for acc in operands if found.get(acc.tensor) and all(p.kind == "axis" for p in acc.positions)]
    values = [expression_support(v, found) for v, _ in lw.stores]
    if all(v is None or v for v in values):  # each stored value zero outside its conditions, whatever the product:
        named = {**at, **{condition_axis(a): at[a] for a in ("m", "n")}}  # a term is dropped where all of them are
        zero.append(z3.And(*(zero_outside(v, named) for v in values if v is not None)))
    said = "; ".join([f"{b.tensor} is zero outside {b.condition.describe()}" for b in window.operands]
                     + [f"the stored values are zero outside {t.condition.describe()}" for t in window.outputs])
    yield Obligation(WINDOW_RULES["k-window"], name, lw.out.tensor,
                     f"every k tile a tile of {lw.out.tensor} skips adds only zeros ({said})",
                     z3.Implies(z3.And(inside, skipped), z3.Or(*zero)),
                     detail="a skipped k tile holds a term the model does not make zero")


__all__ = ["WINDOW_RULES", "window_obligations"]
