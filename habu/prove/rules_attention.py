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

from habu.lower.access import cdiv
from habu.lower.attention import AttentionLowering
from habu.prove.conditions import condition_formula
from habu.prove.obligation import INT31, INT32_OFFSETS, Context, Obligation, Rule
from habu.prove.rules_fields import _grid
from habu.spec.ir import Gather, IndexVar

ATTENTION_RULES = {r.name: r for r in (
    Rule("attention-skip", "the KV tiles a query tile skips hold no key one of its rows may see (the causal "
         "skip is sound)", "a visible key in a skipped tile is missing from the row's softmax"),
    Rule("attention-open-tile", "a KV tile the kernel multiplies without its mask holds only keys every row of "
         "the query tile may see", "a masked key in an unmasked tile enters the row's softmax"),
    Rule("attention-staging", "each staged tile's cp.async chunks cover it once (distinct chunks, inside its rows, "
         "as many as the tile holds) and land in its own array of shared memory; every fragment read (Q's "
         "registers, K's ldmatrix.x4 and V's ldmatrix.x4.trans rows) lies in the array it reads",
         "a staged element is never copied, or a copy or a fragment read lands in another tile's shared memory"),
    Rule("attention-fragments", "the fragment loops cover the tiles (k steps × 16 = #E, key groups × 8 = bn, "
         "column groups × 8 = #D, ...), the warps' accumulator sets are the block's row tiles once each, an "
         "accumulator register decodes to a distinct (row half, column) of the lane, each B fragment takes two "
         "distinct ldmatrix registers", "part of a tile is never multiplied, or a register is read as another"),
    Rule("attention-splits", "split-KV: the splits partition a query tile's KV tiles (each visited tile in exactly "
         "one split), the blocks decode to a split and a block of it, every partial and counter slot lies in its "
         "workspace, and the combining block's elements are the tile's once each",
         "a KV tile is counted twice or never, or a partial lands outside its workspace or on another's slot"),
    Rule("attention-persistent-walk", "a persistent kernel's blocks, walking w = work_of(b, n, grid) for "
         "n = 0, 1, ..., take every work tile exactly once, for every grid from one block to one a tile",
         "a (query tile, batch element) is computed twice or never, or a block walks forever"),
    Rule("attention-q-handoff", "a persistent kernel's single Q buffer: the producer loads a tile's Q only after every "
         "consumer is done with the last one (Q-empty), each consumer's every S reads its own tile's Q, and no wait "
         "deadlocks, under every order of the producer and the consumers",
         "the next tile's Q overwrites one an S still reads, or a barrier phase is waited for that never completes"),
    Rule("attention-kv-loop", "the KV loop starts at the first tile and steps one tile at a time (the copy issued "
         "during tile kt is tile kt + 1's, into the other buffer)", "a KV tile is skipped or its buffer overwritten "
         "while it is multiplied"),
)}


def _holds(lw: AttentionLowering, ctx: Context, var: dict[str, Any], tables: dict[str, Any]) -> Any:
    return z3.BoolVal(True) if lw.mask is None else condition_formula(lw.mask, var, ctx.ext, tables)


def attention_obligations(name: str, lw: AttentionLowering, ctx: Context) -> Iterator[Obligation]:
    from habu.prove.rules import R, _access_obligations, supported  # rules.py imports this module

    k, s, t = lw.kernel, ctx.ext, ctx.target
    axes = {"i": (s[lw.row_extent], 1), "j": (s[lw.key_extent], 1), "e": (s[lw.red_extent], 1),
            "d": (s[lw.col_extent], 1), **{a: (s[e], 1) for a, e in zip(lw.batch_axes, lw.batch_extents, strict=True)}}
    stats = tuple((a, "every store") for a in lw.stats or ())  # the row statistics (a training forward)
    for access, what in ((lw.q, "every load"), (lw.k, "every load"), (lw.v, "every load"), (lw.out, "every store"),
                         *stats):
        yield from _access_obligations(name, access, axes, ctx, lw.index_width, what)
    yield from supported(name, lw, ctx)
    if lw.stats is not None:
        yield Obligation(R["supported-path"], name, None, "a kernel storing the row statistics runs each query tile's "
                         "KV tiles in one warp's loop (no split-KV, no slices merged)", not k.kv_split and k.kv_warps == 1,
                         detail=f"kv_split = {k.kv_split}, kv_warps = {k.kv_warps}: the combine and the merge keep no "
                         "statistics")
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
    yield Obligation(R["supported-path"], name, None, "K/V copies ahead of the key limit (kv_ahead) are the mma.sync "
                     "loop's prologue", not k.kv_ahead or k.main_loop == "mma.sync",
                     detail=f"kv_ahead on the {k.main_loop} loop, whose producer reads the limit first")
    yield Obligation(R["supported-path"], name, None, "KV tiles sliced over warps (kv_warps) run on the mma.sync "
                     "loop", k.kv_warps == 1 or k.main_loop == "mma.sync",
                     detail=f"kv_warps = {k.kv_warps} on the {k.main_loop} loop, which keeps one slice")
    yield Obligation(R["supported-path"], name, None, "persistent blocks run on the wgmma loop",
                     not k.persistent or k.main_loop == "wgmma",
                     detail=f"persistent on the {k.main_loop} loop, which runs one work tile a block")
    gx, _ = lw.grid(s)
    yield _grid(name, "x", "batch elements × query tiles", gx, t.max_grid_x)
    if lw.index_width == 32:
        yield Obligation(INT32_OFFSETS, name, None, "32-bit rows qt·bm + t of every query tile ≤ 2^31−1",
                         lw.query_tiles(s) * k.bm <= INT31, detail="a tile's row exceeds 2^31 − 1 in 32 bits")
        yield Obligation(INT32_OFFSETS, name, None, "32-bit keys kt·bn + t of every KV tile ≤ 2^31−1",
                         s[lw.key_extent] + k.bn <= INT31, detail="a tile's key exceeds 2^31 − 1 in 32 bits")
    if static and k.main_loop == "mma.sync":  # the wgmma loop's TMA boxes, ring and fragments: rules_attention_wgmma
        yield from _staging_obligations(name, lw, n_e, n_d)
        yield from _fragment_obligations(name, lw, n_e, n_d)
    if static and k.kv_split:
        yield from _split_obligations(name, lw, ctx, n_d)
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


def _in(x: Any, lo: Any, hi: Any) -> Any:
    return z3.And(x >= lo, x < hi)


def _staging_obligations(name: str, lw: AttentionLowering, n_e: int, n_d: int) -> Iterator[Obligation]:
    rule = ATTENTION_RULES["attention-staging"]
    k = lw.kernel
    layout = lw.smem_layout()
    stage, row, col, c1, c2 = z3.Ints("stage row col chunk other_chunk")
    tiles = (("Q", k.bm, n_e, lambda r, c0: lw.q_smem(r, c0), lambda st: layout["Qs"]),
             ("K", k.bn, n_e, lambda r, c0: lw.k_smem(stage, r, c0), lambda st: layout[f"Ks{st}"]),
             ("V", k.bn, n_d, lambda r, c0: lw.v_smem(stage, r, c0), lambda st: layout[f"Vs{st}"]))
    for what, rows, width, addr, array in tiles:
        count = lw.copy_chunks(rows, width)
        t1, col1 = lw.copy_chunk(c1, width)
        t2, col2 = lw.copy_chunk(c2, width)
        inside = z3.And(_in(t1, 0, rows), col1 >= 0, col1 + 8 <= width, col1 % 8 == 0,
                        lw.staged_column(col1) >= 0, lw.staged_column(col1) + 8 <= width)
        distinct = z3.Or(t1 != t2, col1 != col2)
        yield Obligation(rule, name, None, f"{what}'s tile ({rows} rows × {width}): its {count} cp.async chunks are "
                         "its 16-byte chunks, each once", z3.And(count * 8 == rows * width, z3.ForAll(
                             [c1, c2], z3.Implies(z3.And(_in(c1, 0, count), _in(c2, 0, count)),
                                                  z3.And(inside, z3.Implies(c1 != c2, distinct))))),
                         detail=f"{what}'s copies miss or repeat a chunk, or leave its rows")
        for st in range(1 if what == "Q" else len({layout[x][0] for x in layout if x.startswith(what)})):
            start, size = array(st)
            at = z3.substitute(z3.IntVal(0) + addr(row, col), (stage, z3.IntVal(st))) if what != "Q" else addr(row, col)
            yield Obligation(rule, name, None, f"{what}'s staged elements (buffer {st}) lie in its array of shared "
                             f"memory (elements {start}..{start + size})",
                             z3.ForAll([row, col], z3.Implies(z3.And(_in(row, 0, rows), _in(col, 0, width)),
                                                              _in(at, start, start + size))),
                             detail=f"a staged element of {what} lands outside its array")
    kt = z3.Int("kv_tile")
    yield Obligation(rule, name, None, "a KV tile's buffer is one of the staged buffers",
                     z3.ForAll([kt], z3.Implies(kt >= 0, _in(lw.stage_of(kt), 0, len([x for x in layout if x[0] == "K"])))),
                     detail="a KV tile is staged outside the buffers")
    # the fragment reads: Q's registers (two elements), K's and V's ldmatrix rows (8 elements)
    warp, lane, kk, jp = z3.Ints("row_tile lane kk pair")
    q_start, q_size = layout["Qs"]
    q_reads = z3.And(*(_in(lw.q_fragment(warp, lane, kk, r), q_start, q_start + q_size - 1) for r in range(4)))
    yield Obligation(rule, name, None, "Q's A fragments read Q's staged tile", z3.ForAll(
        [warp, lane, kk], z3.Implies(z3.And(_in(warp, 0, lw.row_tiles), _in(lane, 0, 32), _in(kk, 0, lw.qk_steps)),
                                     q_reads)), detail="a Q fragment read leaves Q's tile")
    for what, rows_of, steps, pairs, array in (("K", lw.k_rows, lw.qk_steps, lw.key_pairs, "Ks"),
                                               ("V", lw.v_rows, lw.pv_steps, lw.value_pairs, "Vs")):
        for st in range(len([x for x in layout if x.startswith(array)])):
            start, size = layout[f"{array}{st}"]
            at = rows_of(z3.IntVal(st), lane, kk, jp)
            yield Obligation(rule, name, None, f"{what}'s ldmatrix rows (buffer {st}) lie in its staged tile",
                             z3.ForAll([lane, kk, jp], z3.Implies(
                                 z3.And(_in(lane, 0, 32), _in(kk, 0, steps), _in(jp, 0, pairs)),
                                 _in(at, start, start + size - 7))), detail=f"an ldmatrix row of {what} leaves its tile")


def _fragment_obligations(name: str, lw: AttentionLowering, n_e: int, n_d: int) -> Iterator[Obligation]:
    from habu.lower.attention import MMA_K, MMA_M, MMA_N

    rule = ATTENTION_RULES["attention-fragments"]
    k, fr = lw.kernel, lw.fragment
    covers = ((lw.qk_steps * MMA_K, n_e, "the k steps of S = Q·Kᵀ cover #E"),
              (lw.slice_keys * lw.kv_warps, k.bn, "the warps' key slices cover the tile's keys"),
              (lw.key_pairs * 2 * MMA_N, lw.slice_keys, "K's ldmatrix.x4 pairs cover a warp's keys"),
              (lw.score_groups * MMA_N, lw.slice_keys, "S's 8-key groups cover a warp's keys"),
              (lw.pv_steps * MMA_K, lw.slice_keys, "the k steps of O += P·V cover a warp's keys"),
              (lw.out_groups * MMA_N, n_d, "O's 8-column groups cover #D"),
              (lw.value_pairs * 2 * MMA_N, n_d, "V's ldmatrix.x4.trans pairs cover #D"),
              (lw.registers, 4, "an 8-column group holds the m16n8 accumulator's 4 registers"),
              (lw.warps * lw.sets_per_warp * MMA_M, k.bm * lw.kv_warps,
               "the warps' accumulator sets cover the query tile once a key slice"))
    # a warp's slice of the KV tile first: a slice under one k16 step fails every cover below with a 0
    yield Obligation(rule, name, None, f"a warp's key slice (bn {k.bn} / kv_warps {lw.kv_warps} = {lw.slice_keys} keys) "
                     f"is whole k{MMA_K} steps of P·V", lw.slice_keys >= MMA_K and lw.slice_keys % MMA_K == 0,
                     detail=f"kv_warps {lw.kv_warps} leaves each warp {lw.slice_keys} keys of a {k.bn}-key tile: "
                     f"take fewer kv_warps or a wider bn")
    for got, want, text in covers:
        yield Obligation(rule, name, None, f"{text} ({got} = {want})", got == want, detail=f"{got} ≠ {want}")
    w1, m1, w2, m2, q1, q2 = z3.Ints("warp mi other_warp other_mi reg other_reg")
    sets = lambda w, m: z3.And(_in(w, 0, lw.warps), _in(m, 0, lw.sets_per_warp))  # noqa: E731
    one_slice = (lambda w1, w2: z3.BoolVal(True)) if lw.kv_warps == 1 else \
        (lambda w1, w2: lw.key_slice(w1) == lw.key_slice(w2))
    yield Obligation(rule, name, None, "each accumulator set of a warp computes a row tile (and key slice) of its own",
                     z3.ForAll([w1, m1, w2, m2], z3.Implies(z3.And(sets(w1, m1), sets(w2, m2)), z3.And(
                         _in(lw.row_tile(w1, m1), 0, lw.row_tiles), _in(z3.IntVal(0) + lw.key_slice(w1), 0, lw.kv_warps),
                         z3.Implies(z3.And(z3.Or(w1 != w2, m1 != m2), one_slice(w1, w2)),
                                    lw.row_tile(w1, m1) != lw.row_tile(w2, m2))))),
                     detail="two accumulator sets compute one row tile of one key slice, or one computes past the "
                     "query tile")
    if lw.kv_warps > 1:
        yield from _merge_obligations(name, lw)
    h1, p1 = lw.register_parts(q1)
    h2, p2 = lw.register_parts(q2)
    regs = lambda q: _in(q, 0, lw.registers)  # noqa: E731
    yield Obligation(rule, name, None, "an accumulator register decodes to a (row half, column in the pair) of its "
                     "own", z3.ForAll([q1, q2], z3.Implies(z3.And(regs(q1), regs(q2)), z3.And(
                         _in(h1, 0, fr.halves), _in(p1, 0, fr.pair),
                         z3.Implies(q1 != q2, z3.Or(h1 != h2, p1 != p2))))),
                     detail="two registers decode to one element, or one outside the lane's")
    b = [r for half in (0, 1) for r in lw.b_registers(half)]
    yield Obligation(rule, name, None, f"the B fragments take ldmatrix.x4's registers {b} once each",
                     sorted(b) == [0, 1, 2, 3], detail=f"registers {b}")
    kt = z3.Int("kv_tile")
    yield Obligation(ATTENTION_RULES["attention-kv-loop"], name, None,
                     "the KV loop starts at tile 0 and the copy issued during tile kt loads tile kt + 1",
                     z3.And(z3.IntVal(0) + lw.first_tile() == 0,
                            z3.ForAll([kt], lw.next_tile(kt) == kt + 1),
                            z3.ForAll([kt], z3.Implies(kt >= 0, lw.stage_of(lw.next_tile(kt)) != lw.stage_of(kt)))),
                     detail="a KV tile is skipped, or the next one lands in the buffer being multiplied")
    ahead = lw.kv_stages - 1
    first = z3.Int("first_tile")
    yield Obligation(ATTENTION_RULES["attention-kv-loop"], name, None,
                     f"{lw.kv_stages} K/V buffers: the loop's prologue loads tiles first.. first + {ahead - 1}, the copy "
                     f"issued during tile kt loads tile kt + {ahead}, into a buffer none of tiles kt .. kt + {ahead - 1} "
                     "(multiplied or in flight) holds",
                     z3.And(ahead >= 1,
                            *(z3.ForAll([first], z3.IntVal(0) + lw.prologue_tile(first, p) == first + p)
                              for p in range(ahead)),
                            z3.ForAll([kt], z3.IntVal(0) + lw.prefetch_tile(kt) == kt + ahead),
                            *(z3.ForAll([kt], z3.Implies(kt >= 0, lw.stage_of(lw.prefetch_tile(kt)) != lw.stage_of(kt + i)))
                              for i in range(ahead))),
                     detail="a KV tile is skipped or loaded twice, or lands in a buffer still to be multiplied")


def _merge_obligations(name: str, lw: AttentionLowering) -> Iterator[Obligation]:
    """The slices' merge (kv_warps > 1): row t's slice s is read from the warp that computed it, and the merge
    area fits the block's shared memory."""
    rule = ATTENTION_RULES["attention-fragments"]
    k = lw.kernel
    wrong = [(t, sl) for t in range(k.bm) for sl in range(lw.kv_warps)
             if not (0 <= int(lw.merge_warp(t, sl)) < lw.warps and int(lw.key_slice(int(lw.merge_warp(t, sl)))) == sl
                     and any(int(lw.row_tile(int(lw.merge_warp(t, sl)), mi)) == t // 16 for mi in range(lw.sets_per_warp)))]
    yield Obligation(rule, name, None, "the merge reads row t's slice s from the warp computing that row tile's slice s",
                     not wrong, detail=f"(row, slice) {wrong[:1]} is read from another warp")
    assert lw.width_d is not None
    writers = [d for d in range(lw.width_d) if bool(lw.row_writer(d))]
    yield Obligation(rule, name, None, "one merged element of each row writes the row's m and l",
                     len(writers) == 1, detail=f"columns {writers[:4]} write them")
    yield Obligation(rule, name, None, f"the merge area ({lw.merge_bytes()} bytes) fits the block's shared memory "
                     f"({lw.smem_bytes()})", lw.merge_bytes() <= lw.smem_bytes(), detail="the merge overruns")


def _split_obligations(name: str, lw: AttentionLowering, ctx: Context, n_d: int) -> Iterator[Obligation]:
    rule = ATTENTION_RULES["attention-splits"]
    k, s = lw.kernel, ctx.ext
    yield Obligation(rule, name, None, f"a split ({k.kv_split} keys) is whole KV tiles of {k.bn}",
                     k.kv_split % k.bn == 0 and lw.split_tiles * k.bn == k.kv_split, detail="a split cuts a KV tile")
    splits, count, tiles_q = lw.splits(s), lw.batch_count(s), lw.query_tiles(s)
    if lw.combine_in_smem(s):  # the combine's weights in shared memory: a word a (split, row), and the totals apart
        sa, ta, sb, tb = z3.Ints("split row other_split other_row")
        pair = lambda sp, t: z3.And(_in(sp, 0, splits), _in(t, 0, k.bm))  # noqa: E731
        words = lw.combine_words()
        p, q = z3.Ints("pair other_pair")
        ps, pt = lw.combine_pair(p, s)
        qs, qt_ = lw.combine_pair(q, s)
        pairs = lw.combine_pairs(s)
        yield Obligation(rule, name, None, "the combine's pairs are each (split, row) once, its weights, the "
                         f"splits' l and the row totals distinct words of the block's {words}",
                         z3.And(z3.ForAll([p, q], z3.Implies(z3.And(_in(p, 0, pairs), _in(q, 0, pairs)), z3.And(
                             pair(ps, pt), z3.Implies(p != q, z3.Or(ps != qs, pt != qt_))))),
                             pairs == splits * k.bm,
                             z3.ForAll([sa, ta, sb, tb], z3.Implies(z3.And(pair(sa, ta), pair(sb, tb)), z3.And(
                                 _in(lw.combine_w(sa, ta), 0, words), _in(lw.combine_total(ta, s), 0, words),
                                 _in(lw.combine_l(sa, ta, s), 0, words),
                                 lw.combine_w(sa, ta) != lw.combine_total(tb, s),
                                 lw.combine_l(sa, ta, s) != lw.combine_total(tb, s),
                                 lw.combine_l(sa, ta, s) != lw.combine_w(sb, tb),
                                 z3.Implies(z3.Or(sa != sb, ta != tb), lw.combine_w(sa, ta) != lw.combine_w(sb, tb)),
                                 z3.Implies(z3.Or(sa != sb, ta != tb),
                                            lw.combine_l(sa, ta, s) != lw.combine_l(sb, tb, s)),
                                 z3.Implies(ta != tb, lw.combine_total(ta, s) != lw.combine_total(tb, s)))))),
                         detail="two weights or two splits' l share a word, a total or an l overwrites a weight, "
                         "or one lies outside")
    kt, total, s1, s2 = z3.Ints("kv_tile visited one_split other_split")
    within = lambda sp: z3.And(lw.first_tile(sp) <= kt, kt < lw.end_tile(sp, total))  # noqa: E731
    own = z3.IntVal(0) + kt / lw.split_tiles if lw.split_tiles else z3.IntVal(0)
    tiles_max = cdiv(s[lw.key_extent], k.bn)
    yield Obligation(rule, name, None, "every KV tile a query tile visits lies in exactly one split (tile kt in split "
                     f"kt / {lw.split_tiles}, and in no other)",
                     z3.ForAll([kt, total, s1, s2], z3.Implies(
                         z3.And(kt >= 0, kt < total, total <= tiles_max),
                         z3.And(own < splits, within(own),
                                z3.Implies(z3.And(_in(s1, 0, splits), _in(s2, 0, splits), s1 != s2),
                                           z3.Not(z3.And(within(s1), within(s2))))))),
                     detail="a KV tile is in no split, or in two")
    x = z3.Int("block")
    split_of, rest = lw.block_split(x, s)
    yield Obligation(rule, name, None, "each block decodes to a split and a block among its split's",
                     z3.ForAll([x], z3.Implies(_in(x, 0, lw.grid(s)[0]),
                                               z3.And(_in(split_of, 0, splits), _in(rest, 0, count * tiles_q)))),
                     detail="a block decodes to no split or past its split's blocks")
    sp, flat, row, d, qt = z3.Ints("split flat row column query_tile")
    slots = lw.partial_slots(s)
    yield Obligation(rule, name, None, f"each split's partial m, l and O of a row lie in their workspaces ({slots} "
                     f"slots of m and l, × {n_d} of O), one slot per (split, batch element, row)",
                     z3.ForAll([sp, flat, row, d], z3.Implies(
                         z3.And(_in(sp, 0, splits), _in(flat, 0, count), _in(row, 0, s[lw.row_extent]), _in(d, 0, n_d)),
                         z3.And(_in(lw.partial_slot(sp, flat, row, s), 0, slots),
                                _in(lw.partial_offset(sp, flat, row, d, s), 0, slots * n_d),
                                lw.partial_offset(sp, flat, row, d, s) == lw.partial_slot(sp, flat, row, s) * n_d + d))),
                     detail="a partial lands outside its workspace")
    yield Obligation(rule, name, None, "the partial slots of different (split, batch element, row) differ",
                     z3.ForAll([sp, flat, row, s1, qt, d], z3.Implies(
                         z3.And(_in(sp, 0, splits), _in(flat, 0, count), _in(row, 0, s[lw.row_extent]),
                                _in(s1, 0, splits), _in(qt, 0, count), _in(d, 0, s[lw.row_extent]),
                                z3.Or(sp != s1, flat != qt, row != d)),
                         lw.partial_slot(sp, flat, row, s) != lw.partial_slot(s1, qt, d, s))),
                     detail="two splits (or rows) share a partial slot")
    yield Obligation(rule, name, None, "each query tile counts its splits on a counter of its own, inside the workspace",
                     z3.ForAll([flat, qt, s1, s2], z3.Implies(
                         z3.And(_in(flat, 0, count), _in(qt, 0, tiles_q), _in(s1, 0, count), _in(s2, 0, tiles_q)),
                         z3.And(_in(lw.counter_slot(flat, qt, s), 0, count * tiles_q),
                                z3.Implies(z3.Or(flat != s1, qt != s2),
                                           lw.counter_slot(flat, qt, s) != lw.counter_slot(s1, s2, s))))),
                     detail="two query tiles share a counter, or one lies outside the workspace")
    yield Obligation(rule, name, None, "the splits counted on a tile's counter are the tile's splits",
                     z3.IntVal(0) + lw.arrivals(s) == splits, detail="the combine runs before (or never after) the last split")
    e1, e2 = z3.Ints("element other_element")
    t1, c1 = lw.combine_element(e1)
    t2, c2 = lw.combine_element(e2)
    yield Obligation(rule, name, None, f"the combining block's {lw.combine_count} elements are the tile's "
                     f"{k.bm} rows × {n_d} columns, each once", z3.And(lw.combine_count == k.bm * n_d, z3.ForAll(
                         [e1, e2], z3.Implies(z3.And(_in(e1, 0, lw.combine_count), _in(e2, 0, lw.combine_count)),
                                              z3.And(_in(t1, 0, k.bm), _in(c1, 0, n_d),
                                                     z3.Implies(e1 != e2, z3.Or(t1 != t2, c1 != c2)))))),
                     detail="the combine misses or repeats an element of the tile")
    if lw.index_width == 32:
        yield Obligation(INT32_OFFSETS, name, None, "32-bit partial offsets: the O workspace's elements ≤ 2^31−1",
                         slots * n_d <= INT31, detail="the partial O workspace exceeds 2^31 − 1 elements in 32 bits")
