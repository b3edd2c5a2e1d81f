"""The rules of a column kernel (habu/lower/columns.py): every load and the store in bounds and free of
32-bit wrap-around over every row and column, the row and column indices its threads compute (masked
or not) within 32 bits, packed vector loads aligned, its shared-memory partials within the block's
static limit, its grid within the launch limits, and the one rule of its own, `row-split-combine`:
row splits add their partials atomically into an f32 output, and only a Σ does (a plan whose splits
store where they must add, or that adds a max, is refused, naming it)."""

from __future__ import annotations

from collections.abc import Iterator

from habu.lower.columns import ColumnLowering
from habu.prove.obligation import Context, Obligation, Rule
from habu.prove.rules_fields import _grid, _lanes
from habu.prove.rules_smem import column_smem_obligations

COLUMN_RULES = {r.name: r for r in (
    Rule("row-split-combine", "row splits of a column reduction combine their partials atomically into an f32 "
         "output: a Σ adds them (atomicAdd), a max takes their max on order-preserving integer keys "
         "(atomicMax, decoded once every split is in); one split stores directly",
         "atomicAdd/atomicMax semantics: a split that stores overwrites the others' partials (the last write "
         "wins); a max added, or a sum maxed, is another function"),
    Rule("tile-counters", "a column tile's last row split (the one that finishes its epilogue or decodes its "
         "maxima) is found on a counter of its own: slot tile·stride (stride ≥ 1) of the launch's workspace, "
         "inside its ⌈#C / tile⌉ slots",
         "the runtime allocates the workspace per launch in the stream's order and zero-fills it first; "
         "atomicAdd returns each block a distinct count"),
    Rule("column-epilogue-one-tile-row", "a column sum in a contraction's epilogue (habu/lower/column_epilogue.py) "
         "is finished by the one block of its column tile where the tiles of m are one (#M ≤ tile_m) at every size "
         "of m; elsewhere the tile rows' sums meet in the launch's workspace (`combine`), whose offsets stay in "
         "32 bits",
         "a block's sum covers its own rows only: with two tiles of m, each would store a partial sum (the last "
         "write wins)"),
    Rule("scalar-one-column", "a column reduction into a scalar (`da = Σ n …`) has one column: its tile is one "
         "column (column_threads · vector = 1), so exactly one lane stores it",
         "a scalar's store has no column to mask: every column lane of a wider tile stores it (a race)"),
)}

# static shared memory a block may declare (`__shared__` arrays; more needs a dynamic opt-in)
STATIC_SMEM = 48 * 1024


def column_sum_obligations(name: str, lw, ctx: Context) -> Iterator[Obligation]:
    """A contraction kernel's column sum in its epilogue (`ContractionLowering.column_sum`): one tile of m at every
    size of m, and its store's bounds and offsets (along n, its size-1 positions at 0)."""
    from habu.prove.rules import _access_obligations  # (rules.py imports this module)

    cs = lw.column_sum
    if cs is None:
        return
    s = ctx.ext
    rule = COLUMN_RULES["column-epilogue-one-tile-row"]
    if cs.combine:  # the tile rows' sums at tm·#N + n of the workspace: its last slot within 32 bits
        last = cs.partial_offset(cs.arrivals(s) - 1, s[lw.n] - 1, s)
        yield Obligation(rule, name, cs.out.tensor, f"{cs.out.tensor}'s tile rows meet in a workspace of "
                         f"⌈#{lw.m}/{lw.bm}⌉ × #{lw.n} sums, its last offset below 2^31", last < 2**31,
                         detail=f"the workspace's last offset ⌈#{lw.m}/{lw.bm}⌉·#{lw.n} − 1 may reach 2^31")
    else:
        yield Obligation(rule, name, cs.out.tensor,
                         f"{cs.out.tensor} sums every row of #{lw.m} in one tile of {lw.bm} rows", lw.tiles_m(s) == 1,
                         detail=f"#{lw.m} may exceed the tile's {lw.bm} rows: each tile of m would store a partial sum")
    yield from _access_obligations(name, cs.out, {"n": (s[lw.n], lw.bn)}, ctx, lw.index_width, "every store")


def column_obligations(name: str, lw: ColumnLowering, ctx: Context) -> Iterator[Obligation]:
    from habu.prove.rules import (  # the shared access rules (rules.py imports this module)
        R,
        _access_obligations,
        supported,
    )

    k, s, t = lw.kernel, ctx.ext, ctx.target
    axes = {**{a: (s[e], 1) for a, e in zip(lw.row_axes, lw.leading, strict=True)}, "c": (lw.columns(s), 1)}
    for _ld, acc in lw.loads:
        yield from _access_obligations(name, acc, axes, ctx, lw.index_width, "every load")
    for _ld, acc in lw.epi_loads:
        yield from _access_obligations(name, acc, axes, ctx, lw.index_width, "every epilogue load")
    yield from _access_obligations(name, lw.out, axes, ctx, lw.index_width, "every store")
    yield from supported(name, lw, ctx)
    yield Obligation(R["threads"], name, None, f"{k.threads} threads per block ≤ {t.max_threads_per_block}",
                     k.threads <= t.max_threads_per_block, detail=f"{k.threads} threads")
    smem = lw.smem_bytes
    most = min(STATIC_SMEM, t.smem_per_block)
    yield Obligation(R["smem-budget"], name, None,
                     f"{smem} bytes of shared partials ({lw.row_groups} row groups × {lw.tile} columns) ≤ {most}",
                     smem <= most, detail=f"{smem} bytes of static shared memory; a block may declare {most}")
    for _ld, acc in lw.loads:
        if lw.vectorized(acc):
            yield Obligation(R["vector-align"], name, acc.tensor,
                             f"{acc.tensor}'s rows start on {k.vector}-element vectors (#{lw.c} a multiple of "
                             f"{k.vector})", s[lw.c] % k.vector == 0,
                             detail=f"#{lw.c} is not a multiple of {k.vector}: a row's packed loads are misaligned")
    splits, tiles = lw.splits(s), lw.tiles(s)
    if not lw.c:  # (found by searching AXPY-RELU's backward: 24 candidates raced on da, caught by the field check)
        yield Obligation(COLUMN_RULES["scalar-one-column"], name, lw.out.tensor,
                         f"{lw.out.tensor} is a scalar: one column lane stores it", lw.tile == 1,
                         detail=f"a tile of {lw.tile} columns: {lw.tile} lanes store {lw.out.tensor} (a race)")
    rule = COLUMN_RULES["row-split-combine"]
    if lw.combine in ("atomic", "atomic-max"):
        want = "sum" if lw.combine == "atomic" else "max"
        ok = lw.op == want and lw.out.dtype == "f32"
        how = "add" if want == "sum" else "take the max of"
        yield Obligation(rule, name, lw.out.tensor,
                         f"row splits {how} their partials of {lw.out.tensor} atomically: a {want} into f32", ok,
                         detail=f"a {lw.op} into {lw.out.dtype}: the splits {how} f32 partials ({lw.combine})")
    else:
        yield Obligation(rule, name, lw.out.tensor,
                         f"one row split stores {lw.out.tensor} (⌈#{lw.rows_name}/{k.rows_per_split}⌉ ≤ 1): no split "
                         "overwrites another's partial", splits <= 1,
                         detail=f"several row splits store {lw.out.tensor} where they must add (the last write "
                                f"wins); a {lw.op} into {lw.out.dtype} takes one split (rows_per_split ≥ #{lw.rows_name})")
    if lw.final_pass:
        stride = lw.thread_map.counter_stride
        yield Obligation(COLUMN_RULES["tile-counters"], name, lw.counter_tensor,
                         f"column tile t counts its row splits on slot {stride}·t of ⌈#{lw.c or '1'}/{lw.tile}⌉ "
                         "counters: one slot a tile, inside the workspace",
                         (lw.counter_slot(tiles - 1) < lw.counters(s)) if stride >= 1 else False,
                         detail=f"tiles count on slot {stride}·t: " + (
                             "every tile on one counter (a tile's final pass runs before its splits are in)"
                             if stride < 1 else "the last tile's counter lies outside the workspace"))
    yield _grid(name, "x", "one block per column tile", tiles, t.max_grid_x)
    yield _grid(name, "y", "one block per row split", splits, t.max_grid_yz)
    if lw.index_width == 32:
        # the indices a thread computes before any mask: its columns, up to the last tile's end, and its
        # rows, up to the last split's begin plus a full row loop; and the row-column offset there
        # (the maps of habu/lower/column_maps.py, evaluated at the last thread, vector element, tile,
        # split, iteration and unrolled row: their strides are nonnegative, so these are the largest)
        tm = lw.thread_map
        last_col = lw.thread_column(tiles - 1, tm.column_threads - 1, tm.vector - 1)
        last_row = lw.row(lw.row_begin(splits - 1), tm.steps - 1, tm.unroll - 1, tm.row_groups - 1)
        yield _lanes(name, f"the thread's column tile·{tm.tile_columns} + tc·{tm.column_stride} + v, up to "
                           f"⌈#{lw.c}/{lw.tile}⌉·{lw.tile} − 1", last_col)
        yield _lanes(name, f"the thread's row, up to the last split's begin + {tm.steps - 1}·{tm.row_step} + "
                           f"{tm.unroll - 1}·{tm.unroll_step} + {tm.row_groups - 1}", last_row)
        yield from column_smem_obligations(name, lw)
        for _ld, acc in lw.loads:
            if lw.kind_of(acc) == "row-column":
                yield _lanes(name, f"{acc.tensor}'s offset row·#{lw.c} + column at the last row and column a "
                                   "thread computes (masked or not)", last_row * lw.columns(s) + last_col)
            elif lw.kind_of(acc) == "column-row":  # [c r]: a column's rows are contiguous
                yield _lanes(name, f"{acc.tensor}'s offset column·#{lw.rows_name} + row at the last column and row "
                                   "a thread computes (masked or not)", last_col * lw.rows(s) + last_row)
