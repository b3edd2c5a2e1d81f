"""The rules of a fused attention kernel (habu/lower/attention.py): every load and the store in bounds and
free of 32-bit wrap-around, its rows and keys within 32 bits, its grid within the launch limits, its staged
16-byte chunks aligned (#E and #D whole mma steps), its shared memory within the block's opt-in limit, and
the causal skip sound (`attention-skip`): every key a row of a query tile may see (the mask holds and the
key is below #J) lies in a KV tile the block visits, for every query tile, every row of it and every value
an index tensor in the mask may hold; and the tiles it multiplies without the mask sound
(`attention-open-tile`): in a tile `unmasked` says needs none, every key is below #J and seen by every row."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import z3

from habu.lower.attention import AttentionLowering
from habu.prove.obligation import INT31, INT32_OFFSETS, Context, Obligation, Rule
from habu.prove.rules_fields import _grid
from habu.spec.ir import Gather, IndexAffine, IndexConst, IndexVar

ATTENTION_RULES = {r.name: r for r in (
    Rule("attention-skip", "the KV tiles a query tile skips hold no key one of its rows may see (the causal "
         "skip is sound)", "a visible key in a skipped tile is missing from the row's softmax"),
    Rule("attention-open-tile", "a KV tile the kernel multiplies without its mask holds only keys every row of "
         "the query tile may see", "a masked key in an unmasked tile enters the row's softmax"),
)}


def _affine(a: IndexAffine, ctx: Context, var: dict[str, Any], tables: dict[str, Any]) -> Any:
    total: Any = a.const
    for k, e in a.sizes:
        total = total + k * ctx.ext[e]
    for k, ix in a.terms:
        if isinstance(ix, IndexVar):
            value = var[ix.name]
        elif isinstance(ix, Gather):
            value = tables.setdefault(ix.tensor, z3.Int(f"value_{ix.tensor}"))
        else:
            assert isinstance(ix, IndexConst)
            value = ix.value
        total = total + k * value
    return total


def _holds(lw: AttentionLowering, ctx: Context, var: dict[str, Any], tables: dict[str, Any]) -> Any:
    m = lw.mask
    if m is None:
        return z3.BoolVal(True)
    left, right = _affine(m.left, ctx, var, tables), _affine(m.right, ctx, var, tables)
    return {"lt": left < right, "le": left <= right, "gt": left > right, "ge": left >= right,
            "eq": left == right, "ne": left != right}[m.op]


def attention_obligations(name: str, lw: AttentionLowering, ctx: Context) -> Iterator[Obligation]:
    from habu.prove.rules import R, _access_obligations, supported  # rules.py imports this module

    k, s, t = lw.kernel, ctx.ext, ctx.target
    axes = {"i": (s[lw.row_extent], 1), "j": (s[lw.key_extent], 1), "e": (s[lw.red_extent], 1),
            "d": (s[lw.col_extent], 1), **{a: (s[e], 1) for a, e in zip(lw.batch_axes, lw.batch_extents, strict=True)}}
    for access, what in ((lw.q, "every load"), (lw.k, "every load"), (lw.v, "every load"), (lw.out, "every store")):
        yield from _access_obligations(name, access, axes, ctx, lw.index_width, what)
    yield from supported(name, lw, ctx)
    yield Obligation(R["threads"], name, None, f"{lw.threads} threads per block ≤ {t.max_threads_per_block}",
                     lw.threads <= t.max_threads_per_block, detail=f"{lw.threads} threads")
    n_e, n_d = s[lw.red_extent], s[lw.col_extent]
    static = isinstance(n_e, int) and isinstance(n_d, int)
    yield Obligation(R["supported-path"], name, None, f"the head widths #{lw.red_extent} and #{lw.col_extent} are "
                     "known when the kernel is compiled (fragments of Q and O are registers)", static,
                     detail="a head width is a runtime extent")
    if static:
        yield Obligation(R["vector-align"], name, None,
                         f"#{lw.red_extent} = {n_e} and #{lw.col_extent} = {n_d} are whole mma steps of 16 (Q, K and V "
                         "rows staged as 16-byte chunks)", n_e % 16 == 0 and n_d % 16 == 0 and n_e <= 256 and n_d <= 256,
                         detail="a head width is not a multiple of 16 (or over 256)")
        smem = lw.smem_bytes()
        yield Obligation(R["smem-budget"], name, None, f"{smem} bytes of staged Q, K and V tiles ≤ {t.smem_per_block}",
                         smem <= t.smem_per_block, detail=f"{smem} bytes of dynamic shared memory")
    gx, _ = lw.grid(s)
    yield _grid(name, "x", "batch elements × query tiles", gx, t.max_grid_x)
    if lw.index_width == 32:
        yield Obligation(INT32_OFFSETS, name, None, "32-bit rows qt·bm + t of every query tile ≤ 2^31−1",
                         lw.query_tiles(s) * k.bm <= INT31, detail="a tile's row exceeds 2^31 − 1 in 32 bits")
        yield Obligation(INT32_OFFSETS, name, None, "32-bit keys kt·bn + t of every KV tile ≤ 2^31−1",
                         s[lw.key_extent] + k.bn <= INT31, detail="a tile's key exceeds 2^31 − 1 in 32 bits")
    # the causal skip: for every query tile qt, row i of it, key j < #J and index-tensor value, the mask at
    # (i, j) implies that j is below the visited tiles' end
    qt, ti, j = z3.Ints("query_tile row_in_tile key")
    var: dict[str, Any] = {a: z3.Int(f"batch_{a}") for a in lw.batch_axes}
    row = lw.row(qt, ti)
    var["i"], var["j"] = row, j
    tables: dict[str, Any] = {}
    visible = _holds(lw, ctx, var, tables)
    limit_tables: dict[str, Any] = {}

    def term(ix, last) -> Any:
        if isinstance(ix, IndexVar):
            return last if ix.name == "i" else var[ix.name]
        if isinstance(ix, Gather):
            return tables.setdefault(ix.tensor, limit_tables.setdefault(ix.tensor, z3.Int(f"value_{ix.tensor}")))
        return ix.value

    limit = lw.key_limit(qt, s, term)
    tiles = lw.kv_tiles(limit, s, lambda x, lo, hi: z3.If(x < lo, lo, z3.If(x > hi, hi, x)))
    cons = [qt >= 0, qt < lw.query_tiles(s), ti >= 0, ti < k.bm, row < s[lw.row_extent], j >= 0, j < s[lw.key_extent],
            *(var[a] >= 0 for a in lw.batch_axes), *(var[a] < s[e] for a, e in zip(lw.batch_axes, lw.batch_extents,
                                                                                  strict=True))]
    yield Obligation(ATTENTION_RULES["attention-skip"], name, None,
                     "every key a row of a query tile may see lies in one of the KV tiles the block visits "
                     f"(⌈clamp(limit, 0, #{lw.key_extent}) / {k.bn}⌉ tiles)",
                     z3.Implies(z3.And(*cons, visible), j < tiles * k.bn),
                     detail="a query tile skips a KV tile holding a key one of its rows sees")
    # the open tiles: for every KV tile kt the kernel takes as unmasked, every key of it is below #J and seen
    # by every row of the query tile
    kt, tk = z3.Ints("kv_tile key_in_tile")
    key = lw.key(kt, tk)
    var2 = dict(var)
    var2["j"] = key
    seen = _holds(lw, ctx, var2, tables)
    open_limit = lw.open_limit(qt, s, term)
    unmasked = lw.unmasked(kt, open_limit, s, z3.And)
    cons2 = [qt >= 0, qt < lw.query_tiles(s), ti >= 0, ti < k.bm, row < s[lw.row_extent], kt >= 0, tk >= 0,
             tk < k.bn, *(var[a] >= 0 for a in lw.batch_axes),
             *(var[a] < s[e] for a, e in zip(lw.batch_axes, lw.batch_extents, strict=True))]
    yield Obligation(ATTENTION_RULES["attention-open-tile"], name, None,
                     "a KV tile multiplied without the mask holds only keys below #J that every row of the query "
                     "tile sees", z3.Implies(z3.And(*cons2, unmasked), z3.And(key < s[lw.key_extent], seen)),
                     detail="an unmasked KV tile holds a key the mask hides from one of the tile's rows")
