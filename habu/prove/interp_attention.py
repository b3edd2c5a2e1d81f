"""Executing a fused attention kernel over Z_q × GF(p) (habu.spec.field_exp: exp(a + b) = exp(a)·exp(b)
holds exactly), block by block, lane by lane, as the emitter prints it (habu/emit_cuda/emit_attention.py).

Each selected block decodes its query tile and batch element (`query_tile`, `batch_flat`, `batch_coords`),
reads its Q tile (rows masked at #I by the access), finds the keys its rows may see (`key_limit`, with the
mask's index tensors read as the kernel reads them) and visits `kv_tiles` KV tiles. Per tile it computes
S = Q·Kᵀ·scale, masks it (keys past #J and the model's mask: −∞), and hands S to the lanes by the
accumulator fragment (`fragment.element`: register (jn, h, q) of lane l of warp w). The online softmax then
runs per lane: the row maximum over the lane's registers, joined with the lanes lane ^ offset for each of
`quad_offsets` (a shuffle), `running_max`, `rescale` and `kept_max` as the lowering defines them; l and the
O registers are multiplied by exp(rescale); the weights are where(visible, exp(S − m), 0) (in floats a
masked score is −∞ and exp(−∞ − m) = 0; over the field exp has no zero, so the mask selects); P is
gathered from the lanes' registers into the tile, P·V added to each lane's O registers at its fragment
elements. At the end l is summed over the row's lanes and O / l (div0) stored at each register's element.

A max over the field is the product of (r − x) (habu.spec.field): partial maxima join by multiplication,
−∞ is its identity. The float guard `softmax_shift` (0 for a row with no visible key yet) is not modelled:
the check proves the result for any choice of the shift (docs/VERIFY.md), the golden GPU tests the floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

import numpy as np

from habu.lower.attention import MMA_K, MMA_M, MMA_N, AttentionLowering
from habu.prove.conditions import condition_holds
from habu.prove.fragments import instruction_element
from habu.prove.interp import Memory, eval_pointwise, read, write
from habu.prove.interp_attention_merge import MergeEnd, merge_slices
from habu.prove.interp_attention_split import SplitRun
from habu.prove.kinds import KindProof, TileAxis, register_kind, sample_tiles
from habu.spec.ir import Gather, IndexVar


class _FieldOps:
    """The online softmax's arithmetic over the check's field (max: the product of partial maxima)."""

    def __init__(self, field):
        self.f = field

    def max(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.f.op("mul", [a, b])

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.f.op("sub", [a, b])


def _key_limit(lw: AttentionLowering, qt: int, coords: Mapping[str, int], sizes: Mapping[str, int],
               mem: Memory, first: bool = False) -> int:
    def term(ix, last):
        if isinstance(ix, IndexVar):
            return last if ix.name == "i" else int(coords[ix.name])
        if isinstance(ix, Gather):
            at = np.asarray([int(coords[ix.indices[0].name])], dtype=np.int64)  # type: ignore[union-attr]
            return int(np.asarray(mem.table(ix.tensor).at(at))[0])
        return ix.value

    return int((lw.open_limit if first else lw.key_limit)(qt, sizes, term))


def _open_limit(lw: AttentionLowering, qt: int, coords: Mapping[str, int], sizes: Mapping[str, int],
                mem: Memory) -> int:
    return _key_limit(lw, qt, coords, sizes, mem, first=True)


def run_attention(name: str, lw: AttentionLowering, sizes: Mapping[str, int], mem: Memory, blocks,
                  keep: np.ndarray | None = None) -> None:
    split = SplitRun(lw, sizes, mem) if lw.kernel.kv_split else None
    for x in blocks:
        _run_block(name, lw, sizes, mem, int(x), split)
    if split is not None:
        split.finish(name)


# ----------------------------------------------------------------------------- the instruction (PTX ISA)
# The trusted part: where the PTX ISA puts each register element of mma.m16n8k16's bf16 operands and what
# ldmatrix.x4 and ldmatrix.x4.trans hand each lane ("Matrix fragments for mma.m16n8k16", "ldmatrix"), transcribed apart
# from the lowering's maps. groupID g = lane >> 2, threadID_in_group t = lane % 4; register r holds two
# elements (half 0, 1).


def ptx_a_element(lane: np.ndarray, reg: np.ndarray, half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A (16 × 16, row-major): a_{2r+half} at row g + 8·(r & 1), column 2t + half + 8·(r >> 1)."""
    g, t = lane >> 2, lane & 3
    return g + 8 * (reg & 1), 2 * t + half + 8 * (reg >> 1)


def ptx_b_element(lane: np.ndarray, reg: np.ndarray, half: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """B (16 × 8, k × n): b_{2r+half} at k = 2t + half + 8r, n = g."""
    g, t = lane >> 2, lane & 3
    return 2 * t + half + 8 * reg, g


def ldmatrix(rows: np.ndarray, read) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x4.b16: lane l names row l % 8 of matrix l / 8 (`rows[..., l]`, an element
    offset); lane t receives in register m, half h the element [t / 4][2(t % 4) + h] of matrix m. Returns
    (..., 32 lanes, 4 registers, 2 halves) of values, `read(offsets)`."""
    t = np.arange(32)[:, None, None]
    m = np.arange(4)[None, :, None]
    h = np.arange(2)[None, None, :]
    return read(rows[..., 8 * m + t // 4] + 2 * (t % 4) + h)


def ldmatrix_trans(rows: np.ndarray, read) -> np.ndarray:
    """ldmatrix.sync.aligned.m8n8.x4.trans.b16: lane l names row l % 8 of matrix l / 8 (`rows[..., l]`, an
    element offset); lane t receives in register m, half h the element [2(t % 4) + h][t / 4] of matrix m
    (its transpose's row t / 4). Returns (..., 32 lanes, 4 registers, 2 halves) of values, `read(offsets)`."""
    t = np.arange(32)[:, None, None]
    m = np.arange(4)[None, :, None]
    h = np.arange(2)[None, None, :]
    row_lane = 8 * m + 2 * (t % 4) + h  # the lane that named the row holding the element
    return read(rows[..., row_lane] + t // 4)


# ----------------------------------------------------------------------------- one block


def _copy(name: str, lw: AttentionLowering, sizes, mem: Memory, smem: np.ndarray, access, coords, row_axis: str,
          rows_of, col_axis: str, count: int, width: int, dst, where) -> None:
    """A tile's 16-byte chunks (cp.async, zero-filled where masked) into shared memory at `dst(t, c)`."""
    chunk = np.arange(lw.copy_chunks(count, width), dtype=np.int64)
    t, c0 = lw.copy_chunk(chunk, width)
    within = np.arange(8, dtype=np.int64)[None, :]
    cols = np.asarray(lw.staged_column(c0))[:, None] + within
    values = read(name, access, {**coords, row_axis: rows_of(t)[:, None], col_axis: cols}, sizes, mem,
                  lw.index_width, where)
    smem[np.asarray(dst(t, c0))[:, None] + within] = np.broadcast_to(values, cols.shape)


def _per_half(f, op: str, regs: np.ndarray, r_h: np.ndarray, halves: int) -> np.ndarray:
    """(warp, lane, group, register) reduced over the groups and the registers of each row half h:
    (warp, lane, h)."""
    out = []
    for h in range(halves):
        part = regs[..., r_h == h]
        out.append(f.reduce(op, part.reshape(*part.shape[:2], -1), (2,)))
    return np.stack(out, axis=2)


def _b_fragments(lw: AttentionLowering, got: np.ndarray, dst: np.ndarray, steps: np.ndarray, pairs: np.ndarray) -> None:
    """ldmatrix.x4's registers (`got`: (steps, pairs, lane, register, half)) into the k16 × n B operand `dst`:
    B fragment m of pair p (n group 2p + m) is the registers `b_registers(m)`, where the instruction takes
    each of its two registers."""
    lanes = np.arange(32, dtype=np.int64)[:, None]
    for m in (0, 1):
        for breg, reg in enumerate(lw.b_registers(m)):
            kr, nr = ptx_b_element(lanes, np.int64(breg), np.arange(2, dtype=np.int64)[None, :])  # (lane, half)
            dst[steps[..., None] * MMA_K + kr, (2 * pairs[..., None] + m) * MMA_N + nr] = got[:, :, :, reg, :]


def _run_block(name: str, lw: AttentionLowering, sizes: Mapping[str, int], mem: Memory, x: int,
               split: SplitRun | None) -> None:
    f = mem.field
    ops = _FieldOps(f)
    k, fr = lw.kernel, lw.fragment
    split_no, rest = (int(v) for v in lw.block_split(x, sizes))
    qt, flat = int(lw.query_tile(rest, sizes)), int(lw.batch_flat(rest, sizes))
    coords = {a: np.int64(v) for a, v in lw.batch_coords(flat, sizes).items()}

    def where(bad: np.ndarray) -> str:
        return f"block {x} (query tile {qt}, batch element {flat}" + (f", split {split_no})" if split else ")")

    n_e, n_d = sizes[lw.red_extent], sizes[lw.col_extent]
    zero, neg_inf = f.const(Fraction(0)), f.neg_inf()
    smem = np.broadcast_to(zero, (lw.smem_bytes() // 2,)).copy()
    _copy(name, lw, sizes, mem, smem, lw.q, coords, "i", lambda t: lw.row(qt, t), "e", k.bm, n_e, lw.q_smem, where)
    scale = None if lw.scale is None else eval_pointwise(lw.scale, lambda ld: None, f, sizes)
    limit = _key_limit(lw, qt, {a: int(v) for a, v in coords.items()}, sizes, mem)
    tiles = int(lw.end_tile(split_no, lw.kv_tiles(limit, sizes, lambda v, lo, hi: min(max(v, lo), hi))))
    open_limit = _open_limit(lw, qt, {a: int(v) for a, v in coords.items()}, sizes, mem)

    def load_kv(kt: int, stage: int) -> None:
        keys = lambda t: lw.key(kt, t)  # noqa: E731
        _copy(name, lw, sizes, mem, smem, lw.k, coords, "j", keys, "e", k.bn, n_e,
              lambda t, c0: lw.k_smem(stage, t, c0), where)
        _copy(name, lw, sizes, mem, smem, lw.v, coords, "j", keys, "d", k.bn, n_d,
              lambda t, c0: lw.v_smem(stage, t, c0), where)

    # each warp's accumulator sets (warp, mi), by the row tile the lowering gives them (`row_tile`); a set
    # computes its row tile as a warp of one set would
    tiles_of_sets = np.asarray([lw.row_tile(w, mi) for w in range(lw.warps) for mi in range(lw.sets_per_warp)],
                               dtype=np.int64)
    warp_of_sets = np.repeat(np.arange(lw.warps, dtype=np.int64), lw.sets_per_warp)  # the warp running each set
    warps = len(tiles_of_sets)
    w4 = tiles_of_sets[:, None, None, None]  # for the lowering's maps
    sets4 = np.arange(warps, dtype=np.int64)[:, None, None, None]  # for the register arrays
    lanes = np.arange(32, dtype=np.int64)
    l4 = lanes[None, :, None, None]
    # the registers of an 8-column group, as the kernel splits them (`register_parts`: row half h, column in
    # the lane's pair); where the instruction puts each (the C fragment, PTX) and where the kernel takes
    # it to be (the lowering's map)
    regs = np.arange(lw.registers, dtype=np.int64)
    r_h, r_half = (np.asarray(v, dtype=np.int64) for v in lw.register_parts(regs))
    r4 = regs[None, None, None, :]
    c_row, c_col = instruction_element("mma.sync", 0, l4, r4)
    s_groups = np.arange(lw.score_groups)[None, None, :, None]
    o_groups = np.arange(lw.out_groups)[None, None, :, None]
    s_row, s_col = fr.element(w4, l4, s_groups, r_h[r4], r_half[r4])
    s_key = lw.slice_key(warp_of_sets[:, None, None, None], s_col)  # the key in the tile (a warp's slice)
    o_row, o_col = fr.element(w4, l4, o_groups, r_h[r4], r_half[r4])
    halves = fr.halves
    m = np.broadcast_to(f.const(Fraction(1)), (warps, 32, halves)).copy()  # the empty maximum
    l_run = np.broadcast_to(zero, (warps, 32, halves)).copy()
    o = np.broadcast_to(zero, np.broadcast_shapes(o_row.shape, o_col.shape)).copy()
    first = int(lw.first_tile(split_no))
    ahead_limit = int(lw.prologue_limit(split_no, tiles, sizes))
    for p in range(lw.kv_stages - 1):  # the tiles in flight before the loop
        pro = int(lw.prologue_tile(first, p))
        if pro < ahead_limit:
            load_kv(pro, int(lw.stage_of(pro)))
    a_q = np.broadcast_to(zero, (warps, MMA_M, n_e)).copy()
    for kt in range(first, tiles):
        stage = int(lw.stage_of(kt))
        nxt = int(lw.prefetch_tile(kt))
        if nxt < tiles:
            load_kv(nxt, int(lw.stage_of(nxt)))
        if kt == first:  # Q's A fragments, read once; placed where the instruction takes each register
            kk4 = np.arange(lw.qk_steps)[None, None, :, None]
            for reg in range(4):
                off = np.asarray(lw.q_fragment(w4[..., 0], l4[..., 0], kk4[..., 0], reg))  # (w, l, kk)
                for half in range(2):
                    vals = smem[off + half]
                    row, col = ptx_a_element(l4[..., 0], np.int64(reg), np.int64(half))
                    a_q[np.broadcast_to(sets4[..., 0], vals.shape), np.broadcast_to(row, vals.shape),
                        np.broadcast_to(kk4[..., 0] * MMA_K + col, vals.shape)] = vals
        # K's B fragments of this tile's keys the warp takes (its slice), by ldmatrix.x4 from the rows the lanes name
        b_k = np.broadcast_to(zero, (warps, n_e, lw.slice_keys)).copy()
        kk3, jp3 = np.arange(lw.qk_steps)[:, None, None], np.arange(lw.key_pairs)[None, :, None]
        for at, w in enumerate(warp_of_sets):
            named = np.asarray(lw.k_slice_rows(int(w), stage, lanes[None, None, :], kk3, jp3), dtype=np.int64)
            _b_fragments(lw, ldmatrix(named, lambda offs: smem[offs]), b_k[at], kk3, jp3)  # named: (kk, jp, 32)
        s_full = f.contract([a_q, b_k], "wie,wej->wij")  # (set, 16, the slice's keys)
        s_reg = s_full[sets4, c_row, s_groups * MMA_N + c_col]  # (warp, lane, group, register)
        if scale is not None:
            s_reg = f.op("mul", [s_reg, np.broadcast_to(scale, s_reg.shape)])
        rows, keys = lw.row(qt, s_row), lw.key(kt, s_key)
        visible = np.asarray(lw.key_inside(keys, sizes))
        if bool(lw.unmasked(kt, open_limit, sizes, lambda a, b: a and b)):
            visible = np.ones_like(visible)  # the kernel applies no mask to this tile
        elif lw.mask is not None:
            at = {**coords, "i": rows, "j": keys}
            visible = visible & condition_holds(lw.mask, at, sizes, mem)
        visible = np.broadcast_to(visible, s_reg.shape)
        s_reg = np.where(visible, s_reg, neg_inf)
        mx = _per_half(f, "max", s_reg, r_h, halves)  # (warp, lane, h): the lane's registers
        for off in lw.quad_offsets:  # the row's lanes (xor shuffles)
            mx = ops.max(mx, mx[:, lanes ^ off, :])
        m_new = lw.running_max(m, mx, ops)
        alpha = f.op("exp", [lw.rescale(m, m_new, ops)])
        m = lw.kept_max(m, m_new)
        l_run = f.op("mul", [l_run, alpha])
        o = f.op("mul", [o, np.broadcast_to(alpha[:, :, r_h][:, :, None, :], o.shape)])
        shifted = f.op("sub", [s_reg, np.broadcast_to(m_new[:, :, r_h][:, :, None, :], s_reg.shape)])
        p_reg = np.where(visible, f.op("exp", [shifted]), zero)
        l_run = f.op("add", [l_run, _per_half(f, "sum", p_reg, r_h, halves)])
        # P's A fragments: the accumulators the lowering packs into each register, where the instruction
        # takes each register element; V's B fragments by ldmatrix.trans from the rows the lanes name
        a_p = np.broadcast_to(zero, (warps, MMA_M, lw.slice_keys)).copy()
        w3, lw3 = np.arange(warps)[:, None], lanes[None, :]
        b_v = np.broadcast_to(zero, (warps, lw.slice_keys, n_d)).copy()
        for kk in range(lw.pv_steps):
            for reg in range(4):
                for half, (group, q) in enumerate(lw.p_fragment(kk, reg)):
                    if not (0 <= int(group) < lw.score_groups and 0 <= int(q) < lw.registers):
                        mem.fault(f"{name}: P's A fragment of keys {kk * MMA_K}.. packs the accumulator sc[{int(group)}]"
                                  f"[{int(q)}], past the {lw.score_groups} 8-key groups × {lw.registers} registers of S "
                                  f"the kernel declares ({where(None)})")
                        continue
                    row, col = ptx_a_element(lw3, np.int64(reg), np.int64(half))
                    a_p[np.broadcast_to(w3, (warps, 32)), np.broadcast_to(row, (warps, 32)),
                        np.broadcast_to(kk * MMA_K + col, (warps, 32))] = p_reg[:, :, int(group), int(q)]
        kk3, dp3 = np.arange(lw.pv_steps)[:, None, None], np.arange(lw.value_pairs)[None, :, None]
        for at, w in enumerate(warp_of_sets):
            named = np.asarray(lw.v_slice_rows(int(w), stage, lanes[None, None, :], kk3, dp3), dtype=np.int64)
            _b_fragments(lw, ldmatrix_trans(named, lambda offs: smem[offs]), b_v[at], kk3, dp3)  # (kk, dp, 32)
        pv = f.contract([a_p, b_v], "wij,wjd->wid")
        o = f.op("add", [o, pv[sets4, c_row, o_groups * MMA_N + c_col]])
    for off in lw.quad_offsets:
        l_run = f.op("add", [l_run, l_run[:, lanes ^ off, :]])
    if lw.kv_warps > 1:  # the slices' partials merge in shared memory; the merged tile is stored or is the partial
        m_row = fr.element(w4[..., 0], l4[..., 0], 0, np.arange(halves)[None, None, :], 0)[0]
        merge_slices(name, lw, sizes, mem, warp_of_sets, o, o_row, o_col, m, l_run, m_row,
                     MergeEnd(qt, flat, coords, split_no, split, ops), where(None))
        return
    if split is not None:  # the partial into the workspaces; the tile's last split combines
        m_row = fr.element(w4[..., 0], l4[..., 0], 0, np.arange(halves)[None, None, :], 0)[0]
        split.store(name, split_no, flat, qt, o, o_row, o_col, m, l_run, m_row, where(None))
        split.arrive(name, flat, qt, coords, ops, where(None))
        return
    out = f.op("div0", [o, np.broadcast_to(l_run[:, :, r_h][:, :, None, :], o.shape)])
    at = {**coords, "i": np.broadcast_to(lw.row(qt, o_row), o.shape), "d": np.broadcast_to(o_col, o.shape)}
    write(name, lw.out, at, out, sizes, mem, lw.index_width, False, None, where)
    stat_rows = lw.stat_row(w4[..., 0], l4[..., 0], np.arange(halves)[None, None, :])
    store_statistics(name, lw, sizes, mem, coords, lw.row(qt, stat_rows), l4[..., 0], m, l_run, where)


def store_statistics(name: str, lw: AttentionLowering, sizes: Mapping[str, int], mem: Memory,
                     coords: Mapping[str, object], rows: np.ndarray, lanes: np.ndarray, m: np.ndarray,
                     l_run: np.ndarray, where) -> None:
    """The row statistics a training forward keeps (`lw.stats`), as the kernel stores them after the KV loop:
    each row's running maximum m (over the field a max is the product of partial maxima: m is the model's max
    reduction of the visible scores, −∞ its identity) and sum l (joined over the row's lanes), from the lane
    `stat_writer` names, for the rows inside #I. m, l_run: (warp, lane, row half); rows, lanes broadcast to them.
    The kernel's maximum is kept in base 2 (the scores times log2 e) and stored times ln 2: a float-only step,
    as the base-2 exponentials are (docs/VERIFY.md)."""
    if lw.stats is None:
        return
    keep = np.asarray(lw.stat_writer(lanes)) & np.asarray(lw.row_inside(rows, sizes))
    keep = np.broadcast_to(keep, np.broadcast_shapes(keep.shape, np.shape(m)))
    at = {**coords, "i": np.broadcast_to(rows, keep.shape)[keep]}
    for access, values in zip(lw.stats, (m, l_run), strict=True):
        write(name, access, at, np.broadcast_to(values, keep.shape)[keep], sizes, mem, lw.index_width, False, None,
              where)


# ----------------------------------------------------------------------------- the attention kind


LENGTH_BATCH = 8  # batch elements a masked-by-length kernel's check runs every one of (at most)


def _blocks(lw: AttentionLowering, sizes: Mapping[str, int]) -> list[int]:
    """The first, second and last query tile (the tile classes of the causal skip: the first tiles see few
    keys, the last all of them) of the first and the last batch element; of every batch element up to
    `LENGTH_BATCH` where a length tensor bounds the mask (each batch element its own length: the more of them
    run, the likelier one reaches past the first split or KV tile)."""
    count, tiles = int(lw.batch_count(sizes)), int(lw.query_tiles(sizes))
    batch = set(range(count)) if lw.mask_ranges and count <= LENGTH_BATCH else {0, count - 1}
    wanted = {(qt, b) for qt in sample_tiles(tiles) for b in batch}
    if not lw.kernel.head_major:  # query_tile(x) = tiles − 1 − x / count, batch_flat(x) = x mod count
        return sorted((tiles - 1 - qt) * count + b for qt, b in wanted)
    return [x for x in range(count * tiles) if (int(lw.query_tile(x, sizes)), int(lw.batch_flat(x, sizes))) in wanted]


def _final(lw: AttentionLowering, sizes: Mapping[str, int]) -> tuple[object, tuple[np.ndarray, ...], str]:
    """The sample blocks' batch indices and query tiles, and every block of their product (the output box:
    those batch indices, the tiles' rows, every column)."""
    sample = _blocks(lw, sizes)
    count, tiles = int(lw.batch_count(sizes)), int(lw.query_tiles(sizes))
    per_axis: dict[str, set[int]] = {a: set() for a in lw.batch_axes}
    chosen = {int(lw.query_tile(x, sizes)) for x in sample}
    for x in sample:
        for a, v in lw.batch_coords(int(lw.batch_flat(x, sizes)), sizes).items():
            per_axis[a].add(int(v))
    blocks = [x for x in range(count * tiles) if int(lw.query_tile(x, sizes)) in chosen and
              all(int(v) in per_axis[a] for a, v in lw.batch_coords(int(lw.batch_flat(x, sizes)), sizes).items())]
    bm = lw.kernel.bm
    axis_values = {a: np.asarray(sorted(v), dtype=np.int64) for a, v in per_axis.items()}
    axis_values["i"] = np.concatenate([np.arange(qt * bm, min((qt + 1) * bm, sizes[lw.row_extent]))
                                       for qt in sorted(chosen)]).astype(np.int64)
    axis_values["d"] = np.arange(sizes[lw.col_extent], dtype=np.int64)
    box = tuple(axis_values[p.axis] for p in lw.out.positions)
    # split-KV: every split of those tiles, split-major (block s·count·tiles + x); the last combines
    blocks = [s * count * tiles + x for x in blocks for s in range(int(lw.splits(sizes)))]
    return blocks, box, f"{len(blocks)} blocks (the first, second and last query tiles and batch elements)"


def _box(lw: AttentionLowering, box: tuple[np.ndarray, ...], sizes: Mapping[str, int]) -> tuple[object, object, str]:
    blocks, _, text = _final(lw, sizes)
    return blocks, None, text


def _tiled_axes(name: str, lw: AttentionLowering) -> list[TileAxis]:
    """The query tiles and the KV tiles (split-KV: the splits): the witness keeps three of each (the last
    ragged)."""
    keys = lw.kernel.kv_split or lw.kernel.bn
    # the values of a length the mask reads select KV tiles (splits) as the keys do: their range is kept
    # as #J is, so that the witness's lengths reach every split
    lengths = [TileAxis(name, "length", r, keys) for r in lw.mask_ranges]
    return [TileAxis(name, "i", lw.row_extent, lw.kernel.bm), TileAxis(name, "j", lw.key_extent, keys), *lengths]


def _frozen(lw: AttentionLowering) -> tuple[str, ...]:
    return (lw.red_extent, lw.col_extent)  # the head widths: whole mma steps, static


register_kind(AttentionLowering, KindProof(run=run_attention, final_selection=_final, box_selection=_box,
                                           tiled_axes=_tiled_axes, frozen_extents=_frozen, exp_field=True,
                                           length_ranges=lambda lw: lw.mask_ranges))
