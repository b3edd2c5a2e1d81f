"""The rules of a grouped-GEMM kernel (habu/lower/grouped.py): every load and the store in bounds and
free of 32-bit wrap-around, the rows its tile scheduler computes (masked or not) within 32 bits, its
grid within the launch limits and large enough for every grouping (`grouped-schedule`), its 16-byte
staged chunks aligned, its shared memory within the block's static limit; a scatter-add epilogue
(`T[IX[r] n] += …`) adds with f32 atomicAdd (`scatter-accumulates`), its stored row IX[r] checked against
T's rows like every gathered index (`_access_obligations` of the store), its row factor P[r] in bounds."""

from __future__ import annotations

from collections.abc import Iterator

import z3

from habu.lower.general import Store
from habu.lower.grouped import GroupedLowering
from habu.lower.grouped_wgmma import wgmma_refusal
from habu.lower.grouped_wgrad import GroupedWgradLowering
from habu.prove.obligation import INT31, INT32_OFFSETS, Context, Obligation, Rule
from habu.prove.pipeline import pipeline_problem
from habu.prove.rules_fields import FIELD_RULES, _grid
from habu.prove.rules_grouped_wgrad import grouped_wgrad_obligations

GROUPED_RULES = {r.name: r for r in (
    Rule("grouped-schedule", "the grid of a grouped GEMM has a block for every row tile of every grouping of "
         "#R rows into #G groups (a group of c rows has ⌈c/bm⌉ tiles, an empty one none)",
         "a row tile past the grid is never computed: its rows stay unwritten"),
    Rule("grouped-stage-maps", "the mma.sync loop's (and the wgmma loop's producer) threads copy every 16-byte chunk of A's and W's k tiles into "
         "their stage tiles, inside a staged row, and every warp's operand words and accumulator registers lie "
         "inside the tile (over every thread, copy, warp, lane and register)",
         "a chunk no thread copies leaves stale shared memory in the product; a copy or read past its tile reads or "
         "overwrites another tile"),
)}

STATIC_SMEM = 48 * 1024


def _wgmma_obligations(name: str, lw: GroupedLowering, ctx: Context) -> Iterator[Obligation]:
    """The wgmma main loop: a target with wgmma and TMA, a kernel the loop can run (bf16 A and W, bk 64,
    whole warpgroups of 64-row slabs), its stage maps, and its ring delivering every k tile to its step
    (`pipeline-schedule`, executed by habu.prove.pipeline over one tile, a long one and several)."""
    from habu.prove.rules import R

    t = ctx.target
    refusal = wgmma_refusal(lw.kernel, lw.a.dtype, lw.w.dtype, lw.pair is not None, lw.w_n_major)
    if refusal is None and not (t.wgmma and t.tma):
        refusal = f"{t.name} has no wgmma and TMA"
    if refusal is None and lw.wgmma is None:
        refusal = "the wgmma stage tiles have no maps for this tile (128-byte rows, stages evenly spaced)"
    yield Obligation(R["supported-path"], name, None, "the wgmma main loop runs this grouped kernel",
                     refusal is None, detail=refusal or "")
    if lw.wgmma is not None:  # the producer's copies of A: inside the tile's bm rows and the k tile (its row r =
        # offs[g] + m·bm + i is the grouped int32 obligation's, i < bm)
        import numpy as np

        loop = lw.wgmma
        ptid = np.asarray(loop.producer_thread(np.arange(loop.warpgroup_size)))[:, None]
        rows = np.asarray(loop.a_copy_row(ptid, np.arange(max(loop.producer_copies(), 1))[None, :]))
        ks = np.asarray(loop.a_copy_k(ptid))
        vec = loop.operands.a_copy.vector
        inside = bool(((rows >= 0) & (rows < lw.kernel.bm)).all() and ((ks >= 0) & (ks + vec <= loop.operands.bk)).all())
        yield Obligation(GROUPED_RULES["grouped-stage-maps"], name, None,
                         f"the producer's copies of A lie in the {lw.kernel.bm} × {loop.operands.bk} tile", inside,
                         detail="a producer thread copies a row or k outside A's tile")
        yield from _tma_coordinates(name, lw, ctx)
        problem = pipeline_problem(lw.wgmma.ring)
        yield Obligation(FIELD_RULES["pipeline-schedule"], name, None,
                         f"the wgmma loop's ring of {lw.wgmma.ring.stages} stages delivers every k tile to its step",
                         problem is None, detail=problem or "")


def _tma_coordinates(name: str, lw: GroupedLowering, ctx: Context) -> Iterator[Obligation]:
    """W's boxes by TMA (the wgmma loop): the threads pass 32-bit coordinates (`w_box_coordinates` of the
    tile's group, first column and k tile: at most #G − 1, (column tiles − 1)·bn, (k tiles − 1)·bk), which
    fit in a signed int for every tile; the copy engine forms the element addresses from them (so W's
    offsets need no 64-bit arithmetic in the kernel, `GroupedLowering.weights_width`), and its global dims
    are W's extents, 1..2^32."""
    from habu.prove.rules import R

    s, loop = ctx.ext, lw.wgmma
    assert loop is not None
    gy = lw.grid(s)[1]
    g, nt, kt = z3.Ints("tma_group tma_column_tile tma_k_tile")
    cons = [g >= 0, g < s[lw.g], nt >= 0, nt < gy, kt >= 0, kt < lw.k_steps(s)]
    for w in (lw.w,) if lw.pair is None else (lw.w, lw.pair.w):
        coords = [x for j in range(loop.w_boxes) for x in loop.w_box_coordinates(w, g, lw.column(nt, 0), lw.k_index(kt, 0), j)]
        yield Obligation(INT32_OFFSETS, name, w.tensor, f"{w.tensor}'s TMA box coordinates fit in 32-bit ints",
                         z3.Implies(z3.And(*cons), z3.And(*(z3.And(x >= 0, x <= INT31) for x in coords))),
                         detail=f"a coordinate of {w.tensor}'s box exceeds 2^31 − 1")
        e = ctx.dtype_bytes(w)
        strides = [w.stride(i, s) * e for i in range(len(w.positions) - 1)]  # every dimension's but the innermost
        yield Obligation(R["tma-stride-16B"], name, w.tensor, f"{w.tensor}'s TMA strides are multiples of 16 bytes, "
                         "below 2^40", z3.And(*(z3.And(x % 16 == 0, x < 2**40) for x in strides)),
                         detail=f"{w.tensor}'s strides are {' and '.join(_stride_text(w, i, ctx) for i in range(len(w.positions) - 1))} "
                         "bytes: not all multiples of 16")
        dims = [s[e] for e in w.bounded_extents()]
        yield Obligation(R["tma-dims"], name, w.tensor, f"{w.tensor}'s TMA global dims are 1..2^32",
                         z3.And(*(z3.And(d >= 1, d <= 2**32) for d in dims)),
                         detail=f"a global dim of {w.tensor} is outside 1..2^32")


def _stride_text(w, i: int, ctx: Context) -> str:
    """Dimension i's stride in bytes: a number where the sizes are known, else its product of extents."""
    stride = w.stride(i, ctx.ext) * ctx.dtype_bytes(w)
    return str(stride) if isinstance(stride, int) else " × ".join(f"#{e}" for e in w.strides[i]) + f" × {ctx.dtype_bytes(w)}"


def _mma_obligations(name: str, lw: GroupedLowering) -> Iterator[Obligation]:
    """The mma.sync loop's maps (habu/lower/grouped_mma.py) over every thread, copy, warp, lane and register:
    the copies cover each k tile and stay inside a staged row, the operand words and the accumulator's
    elements inside the tile (the route itself, element by element, is the finite-field check's)."""
    import numpy as np

    loop = lw.mma
    rule = GROUPED_RULES["grouped-stage-maps"]
    if loop is None:
        yield Obligation(rule, name, None, "the mma.sync loop has stage maps", False, detail="no maps for this tile")
        return
    for side, copy, tile in (("A", loop.a_copy, loop.a_tile), ("W", loop.w_copy, loop.w_tile)):
        turns = loop.copies(copy)
        yield Obligation(rule, name, None, f"{loop.threads} threads × {turns} copies cover {side}'s {copy.count} "
                         "16-byte chunks of a k tile", turns * loop.threads == copy.count,
                         detail=f"{loop.threads} threads × {turns} copies of {copy.count} chunks: "
                         f"{copy.count - turns * loop.threads} never copied")
        e = np.asarray(loop.chunk(np.arange(loop.threads)[:, None], np.arange(max(turns, 1))[None, :])).ravel()
        row, col = tile.storage(*copy.element(*copy.along(e)))
        inside = bool(((row >= 0) & (row < tile.rows) & (col >= 0) & (col + copy.vector <= copy.inner)).all())
        yield Obligation(rule, name, None, f"every copy of {side} lands in a {tile.rows} × {copy.inner} k tile of "
                         "its stage tile", inside, detail=f"a copy of {side} lands outside its stage tile's k tile")
    g, lane = loop.grid, np.arange(32)
    mi, ni = loop.mma_tiles
    warps = np.arange(loop.threads // loop.warp_size)
    w, l_, i, j = np.meshgrid(warps, lane, np.arange(max(mi, 1)), np.arange(max(ni, 1)), indexing="ij")
    a_rows = [np.asarray(loop.a_row(g.warp_m(w), i, l_)) + loop.a_read.word(r)[0] for r in range(loop.a_read.registers)]
    w_rows = [np.asarray(loop.w_row(g.warp_n(w), j, l_)) + loop.w_read.word(r)[0] for r in range(loop.w_read.registers)]
    ks = np.arange(0, loop.bk, loop.mma_k)
    k_cols = [np.asarray(loop.k_col(ks[:, None], lane[None, :])) + read.word(r)[1]
              for read in (loop.a_read, loop.w_read) for r in range(read.registers)]
    q = np.arange(loop.fragment.registers(1))
    er, ec = loop.accumulator(g.warp_m(w)[..., None], g.warp_n(w)[..., None], i[..., None], j[..., None],
                              l_[..., None], q)
    ok = (all(((r >= 0) & (r < lw.kernel.bm)).all() for r in a_rows)
          and all(((r >= 0) & (r < lw.kernel.bn)).all() for r in w_rows)
          and all(((k >= 0) & (k + loop.a_read.pair <= loop.bk)).all() for k in k_cols)
          and bool(((er >= 0) & (er < lw.kernel.bm) & (ec >= 0) & (ec < lw.kernel.bn)).all()))
    yield Obligation(rule, name, None, f"every warp's operand words and accumulator registers lie in the "
                     f"{lw.kernel.bm} × {lw.kernel.bn} × {loop.bk} tile", ok,
                     detail="a warp reads an operand word or stores an accumulator register outside its tile")


def grouped_obligations(name: str, lw: GroupedLowering, ctx: Context) -> Iterator[Obligation]:
    from habu.prove.rules import R, _access_obligations, supported  # rules.py imports this module

    if isinstance(lw, GroupedWgradLowering):  # the family's second form (habu/lower/grouped_wgrad.py)
        yield from grouped_wgrad_obligations(name, lw, ctx)
        return

    k, s, t = lw.kernel, ctx.ext, ctx.target
    axes = {"r": (s[lw.r], 1), "n": (s[lw.n], 1), "k": (s[lw.k], 1), "g": (s[lw.g], 1)}
    yield from _access_obligations(name, lw.a, axes, ctx, lw.index_width, "every load")
    yield from _access_obligations(name, lw.w, axes, ctx, lw.weights_width, "every load")
    yield from _access_obligations(name, lw.out, axes, ctx, lw.index_width, "every store")
    if lw.row_scale is not None:
        yield from _access_obligations(name, lw.row_scale, axes, ctx, lw.index_width, "every load")
    if lw.pair is not None:  # the second weights of a pair
        yield from _access_obligations(name, lw.pair.w, axes, ctx, lw.weights_width, "every load")
    if lw.node.scatter is not None:
        ok = lw.store is Store.ATOMIC_ADD and lw.out.dtype == "f32"
        yield Obligation(R["scatter-accumulates"], name, lw.out.tensor,
                         f"the scatter into {lw.out.tensor} adds each value with f32 atomicAdd",
                         ok, detail=f"the kernel stores {lw.out.tensor} ({lw.out.dtype}) by {lw.store.value}: "
                         "rows whose indices repeat would overwrite each other")
    yield from supported(name, lw, ctx)
    yield Obligation(R["threads"], name, None, f"{lw.threads} threads per block ≤ {t.max_threads_per_block}",
                     lw.threads <= t.max_threads_per_block, detail=f"{lw.threads} threads")
    groups = s[lw.g]
    yield Obligation(R["supported-path"], name, None, f"the number of groups #{lw.g} is known when the kernel is "
                     "compiled (each block keeps the offsets in shared memory)", isinstance(groups, int),
                     detail=f"#{lw.g} is a runtime extent")
    if lw.uses_wgmma:
        yield from _wgmma_obligations(name, lw, ctx)
    else:
        yield from _mma_obligations(name, lw)
    if isinstance(groups, int):
        offsets = 8 * (groups + 1)
        if lw.uses_wgmma:  # the stage tiles and barriers are dynamic, the offsets static: one block's sum
            smem, most = lw.dynamic_smem_bytes() + offsets, t.smem_per_block
            what = f"{smem} bytes of stage tiles, barriers and offsets ≤ {most}"
        else:
            smem, most = lw.smem_bytes() + offsets, min(STATIC_SMEM, t.smem_per_block)
            what = f"{smem} bytes of staged tiles and offsets ≤ {most}"
        yield Obligation(R["smem-budget"], name, None, what,
                         smem <= most, detail=f"{smem} bytes of shared memory; a block may have {most}")
    yield Obligation(R["vector-align"], name, None,
                     f"A's and W's rows start on 16-byte chunks (#{lw.k} a multiple of 8)", s[lw.k] % 8 == 0,
                     detail=f"#{lw.k} is not a multiple of 8: the staged 16-byte chunks are misaligned")
    gx, gy = lw.grid(s)
    yield _grid(name, "x", "row tiles of any grouping", gx, t.max_grid_x)
    yield _grid(name, "y", "one block per column tile", gy, t.max_grid_yz)
    # the schedule: a group of c rows has ⌈c/bm⌉ tiles, and ⌈c/bm⌉·bm ≤ c + bm − 1 for every c ≥ 0; summed
    # over the #G groups (Σ c = #R) the tiles are at most ⌊(#R + #G·(bm − 1))/bm⌋, grid.x
    c = z3.Int("group_rows")
    per_group = z3.Implies(c >= 0, lw.m_tiles(0, c) * k.bm <= c + k.bm - 1)  # c free: for every c
    yield Obligation(GROUPED_RULES["grouped-schedule"], name, None,
                     f"⌈c/{k.bm}⌉·{k.bm} ≤ c + {k.bm} − 1 for a group of c rows, so the row tiles of any grouping "
                     f"are at most ⌊(#{lw.r} + #{lw.g}·{k.bm - 1})/{k.bm}⌋ = grid.x", per_group,
                     detail="a grouping has more row tiles than the grid has blocks")
    if lw.index_width == 32:
        # the rows a live block computes before its mask: offs[g] + m·bm + i with m below the group's
        # tiles: at most offs[g+1] + bm − 2 ≤ #R + bm − 2
        lo, hi, m, i = z3.Ints("offs_g offs_g1 row_tile lane")
        row = lw.row(lo, m, i)
        cons = [lo >= 0, lo <= hi, hi <= s[lw.r], m >= 0, m < lw.m_tiles(lo, hi), i >= 0, i < k.bm]
        yield Obligation(INT32_OFFSETS, name, None,
                         f"32-bit rows offs[g] + m·{k.bm} + i of a live tile (masked or not) ≤ 2^31−1",
                         z3.Implies(z3.And(*cons), z3.And(row <= INT31, row <= s[lw.r] + k.bm - 2)),
                         detail="a tile's row exceeds 2^31 − 1 in 32 bits; use 64-bit indices (--pin index=64)")
        col = lw.column(gy - 1, k.bn - 1)
        yield Obligation(INT32_OFFSETS, name, None, f"32-bit columns nt·{k.bn} + j (masked or not) ≤ 2^31−1",
                         col <= INT31, detail="a tile's column exceeds 2^31 − 1 in 32 bits")
