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

from habu.lower.attention import MMA_N, AttentionLowering
from habu.prove.interp import Memory, eval_pointwise, read, write
from habu.prove.interp_general import condition_holds
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
               mem: Memory) -> int:
    def term(ix, last):
        if isinstance(ix, IndexVar):
            return last if ix.name == "i" else int(coords[ix.name])
        if isinstance(ix, Gather):
            at = np.asarray([int(coords[ix.indices[0].name])], dtype=np.int64)  # type: ignore[union-attr]
            return int(np.asarray(mem.table(ix.tensor).at(at))[0])
        return ix.value

    return int(lw.key_limit(qt, sizes, term))


def run_attention(name: str, lw: AttentionLowering, sizes: Mapping[str, int], mem: Memory, blocks,
                  keep: np.ndarray | None = None) -> None:
    for x in blocks:
        _run_block(name, lw, sizes, mem, int(x))


def _run_block(name: str, lw: AttentionLowering, sizes: Mapping[str, int], mem: Memory, x: int) -> None:
    f = mem.field
    ops = _FieldOps(f)
    k, fr = lw.kernel, lw.fragment
    qt, flat = int(lw.query_tile(x, sizes)), int(lw.batch_flat(x, sizes))
    coords = {a: int(v) for a, v in lw.batch_coords(flat, sizes).items()}

    def where(bad: np.ndarray) -> str:
        return f"block {x} (query tile {qt}, batch element {flat})"

    n_e, n_d = sizes[lw.red_extent], sizes[lw.col_extent]
    rows = np.asarray(lw.row(qt, np.arange(k.bm, dtype=np.int64)), dtype=np.int64)
    es, ds = np.arange(n_e, dtype=np.int64), np.arange(n_d, dtype=np.int64)
    q_tile = read(name, lw.q, {**coords, "i": rows[:, None], "e": es[None, :]}, sizes, mem, lw.index_width, where)
    q_tile = np.ascontiguousarray(np.broadcast_to(q_tile, (k.bm, n_e)))
    scale = None if lw.scale is None else eval_pointwise(lw.scale, lambda ld: None, f, sizes)
    limit = _key_limit(lw, qt, coords, sizes, mem)
    tiles = int(lw.kv_tiles(limit, sizes, lambda v, lo, hi: min(max(v, lo), hi)))
    # the registers: (warp, lane, group, h, q) -> (row in tile, column in tile)
    warps, lanes = lw.warps, np.arange(32, dtype=np.int64)
    w_ix = np.arange(warps, dtype=np.int64)[:, None, None, None, None]
    l_ix = lanes[None, :, None, None, None]
    h_ix = np.arange(2, dtype=np.int64)[None, None, None, :, None]
    q_ix = np.arange(2, dtype=np.int64)[None, None, None, None, :]
    s_r, s_c = fr.element(w_ix, l_ix, np.arange(k.bn // MMA_N)[None, None, :, None, None], h_ix, q_ix)
    o_r, o_c = fr.element(w_ix, l_ix, np.arange(n_d // MMA_N)[None, None, :, None, None], h_ix, q_ix)
    zero, neg_inf = f.const(Fraction(0)), f.neg_inf()
    m = np.broadcast_to(f.const(Fraction(1)), (warps, 32, 2)).copy()  # the empty maximum
    l_run = np.broadcast_to(zero, (warps, 32, 2)).copy()
    o = np.broadcast_to(zero, o_r.shape).copy()
    for kt in range(tiles):
        keys = np.asarray(lw.key(kt, np.arange(k.bn, dtype=np.int64)), dtype=np.int64)
        k_tile = read(name, lw.k, {**coords, "j": keys[:, None], "e": es[None, :]}, sizes, mem, lw.index_width, where)
        v_tile = read(name, lw.v, {**coords, "j": keys[:, None], "d": ds[None, :]}, sizes, mem, lw.index_width, where)
        k_tile = np.ascontiguousarray(np.broadcast_to(k_tile, (k.bn, n_e)))
        v_tile = np.ascontiguousarray(np.broadcast_to(v_tile, (k.bn, n_d)))
        s = f.contract([q_tile, k_tile], "ie,je->ij")
        if scale is not None:
            s = f.op("mul", [s, np.broadcast_to(scale, s.shape)])
        visible = np.asarray(lw.key_inside(keys, sizes))[None, :] & np.ones((k.bm, 1), dtype=bool)
        if lw.mask is not None:
            at = {**{a: np.int64(v) for a, v in coords.items()}, "i": rows[:, None], "j": keys[None, :]}
            visible = visible & np.broadcast_to(condition_holds(lw.mask, at, sizes, mem), visible.shape)
        s = np.where(visible, s, neg_inf)
        s_reg, vis_reg = s[s_r, s_c], visible[s_r, s_c]  # (warp, lane, jn, h, q)
        mx = f.reduce("max", np.moveaxis(s_reg, 2, 3), (3, 4))  # (warp, lane, h): the lane's registers
        for off in lw.quad_offsets:  # the row's lanes (xor shuffles)
            mx = ops.max(mx, mx[:, lanes ^ off, :])
        m_new = lw.running_max(m, mx, ops)
        alpha = f.op("exp", [lw.rescale(m, m_new, ops)])
        m = lw.kept_max(m, m_new)
        l_run = f.op("mul", [l_run, alpha])
        o = f.op("mul", [o, alpha[:, :, None, :, None]])
        shifted = f.op("sub", [s_reg, np.broadcast_to(m_new[:, :, None, :, None], s_reg.shape)])
        p_reg = np.where(vis_reg, f.op("exp", [shifted]), zero)
        l_run = f.op("add", [l_run, f.reduce("sum", np.moveaxis(p_reg, 2, 3), (3, 4))])
        p = np.broadcast_to(zero, (k.bm, k.bn)).copy()
        p[s_r, s_c] = p_reg  # P's A fragments are S's registers (every element held by exactly one lane)
        pv = f.contract([p, v_tile], "ij,jd->id")
        o = f.op("add", [o, pv[o_r, o_c]])
    for off in lw.quad_offsets:
        l_run = f.op("add", [l_run, l_run[:, lanes ^ off, :]])
    out = f.op("div0", [o, np.broadcast_to(l_run[:, :, None, :, None], o.shape)])
    out_rows = rows[o_r]
    write(name, lw.out, {**coords, "i": out_rows, "d": o_c}, out, sizes, mem, lw.index_width, False, None, where)


# ----------------------------------------------------------------------------- the attention kind


def _blocks(lw: AttentionLowering, sizes: Mapping[str, int]) -> list[int]:
    """The first, second and last query tile (the tile classes of the causal skip: the first tiles see few
    keys, the last all of them) of the first and the last batch element."""
    count, tiles = int(lw.batch_count(sizes)), int(lw.query_tiles(sizes))
    out = []
    for qt in sample_tiles(tiles):
        for b in sorted({0, count - 1}):
            out.append((tiles - 1 - qt) * count + b)  # query_tile(x) = tiles − 1 − x / count
    return sorted(set(out))


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
    return blocks, box, f"{len(blocks)} blocks (the first, second and last query tiles and batch elements)"


def _box(lw: AttentionLowering, box: tuple[np.ndarray, ...], sizes: Mapping[str, int]) -> tuple[object, object, str]:
    blocks, _, text = _final(lw, sizes)
    return blocks, None, text


def _tiled_axes(name: str, lw: AttentionLowering) -> list[TileAxis]:
    """The query tiles and the KV tiles: the witness keeps three of each (the last ragged)."""
    return [TileAxis(name, "i", lw.row_extent, lw.kernel.bm), TileAxis(name, "j", lw.key_extent, lw.kernel.bn)]


def _frozen(lw: AttentionLowering) -> tuple[str, ...]:
    return (lw.red_extent, lw.col_extent)  # the head widths: whole mma steps, static


register_kind(AttentionLowering, KindProof(run=run_attention, final_selection=_final, box_selection=_box,
                                           tiled_axes=_tiled_axes, frozen_extents=_frozen, exp_field=True))
