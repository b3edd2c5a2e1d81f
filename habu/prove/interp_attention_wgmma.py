"""Executing the fused attention kernel's wgmma main loop (habu/lower/attention_wgmma.py) over Z_q × GF(p), block
by block, warpgroup by warpgroup, lane by lane, as habu/emit_cuda/emit_attention_wgmma.py prints it.

The producer's TMA boxes land in shared memory where the driver's 128-byte swizzle puts them
(`habu.prove.fragments.tma_box_bytes`), each element read from the tensor at the box's origin and zero past
the tensor map's dims (the access's `bounded_extents`, what the emitter encodes). Before the consumers
read tile kt the producer has filled every stage the earlier tiles left (tiles up to kt + S − 1), so a
stage index that repeats too early overwrites a tile still to be multiplied; the producer and the
consumers walk the ring's (stage, phase) by `MbarrierRing.advance`. The consumers read their operands
through the descriptors' start addresses and fields the lowering gives, laid out as the PTX ISA's wgmma
shared-memory layouts state (`wgmma_kmajor_addresses`, `wgmma_mnmajor_addresses`), and hold S and O in
the registers the ISA's accumulator layout gives (`instruction_element("wgmma", ...)`); the online softmax
(the FA2 lowering's `running_max`, `rescale`, `kept_max`, the mask on `s_element`) runs on those registers,
P's A registers are packed by `p_registers` and placed by the ISA's register-A layout (`wgmma_a_element`,
below), and O is stored from `o_element`. What is not modelled: the float guard `softmax_shift` (as for
mma.sync), and the timing of the ring, which the `pipeline-schedule` rule runs (habu.prove.pipeline).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

import numpy as np

from habu.lower.access import size_of
from habu.lower.attention_wgmma import K_STEP, SLAB, SPAN, AttentionWgmmaLowering
from habu.prove.fragments import (
    instruction_element,
    tma_box_bytes,
    wgmma_kmajor_addresses,
    wgmma_mnmajor_addresses,
)
from habu.prove.interp import Memory, eval_pointwise, read, write
from habu.prove.interp_attention import _box, _final, _frozen, _key_limit, _open_limit, _tiled_axes
from habu.prove.interp_general import condition_holds
from habu.prove.kinds import KindProof, register_kind

# ----------------------------------------------------------------------------- the instruction (PTX ISA)
# "Register fragments and shared memory matrix layouts, wgmma .m64nNk16, matrix A in registers": warp w of
# the warpgroup holds rows 16w .. 16w + 15 of A (64 × 16); within the warp, as mma.m16n8k16's A: groupID
# g = lane >> 2, threadID_in_group t = lane % 4; register r holds a_{2r}, a_{2r+1} at row g + 8·(r & 1),
# columns 2t + half + 8·(r >> 1).


def wgmma_a_element(warp: np.ndarray, lane: np.ndarray, reg: np.ndarray, half: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    g, t = lane >> 2, lane & 3
    return 16 * warp + g + 8 * (reg & 1), 2 * t + half + 8 * (reg >> 1)


class _FieldOps:
    def __init__(self, field):
        self.f = field

    def max(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.f.op("mul", [a, b])

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.f.op("sub", [a, b])


def run_attention_wgmma(name: str, lw: AttentionWgmmaLowering, sizes: Mapping[str, int], mem: Memory, blocks,
                        keep: np.ndarray | None = None) -> None:
    for x in blocks:
        _run_block(name, lw, sizes, mem, int(x))


def _tma_load(name: str, lw: AttentionWgmmaLowering, access, origin: Mapping[str, object], dst: int,
              smem: np.ndarray, sizes: Mapping[str, int], mem: Memory, where) -> None:
    """One TMA box of `access` at `origin` (by axis) into shared memory at byte `dst`: 64 columns of its
    contiguous axis by the rows of its query or key axis, zero past the tensor map's dims."""
    extent = lw.box_extent(access)
    inner = access.positions[-1].axis
    outer = next(p.axis for p in access.positions if p.axis in ("i", "j"))
    rows = extent[outer]
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(SPAN, dtype=np.int64)[None, :]
    coords, inside = {}, np.ones((rows, SPAN), dtype=bool)
    for p, bound in zip(access.positions, access.bounded_extents(), strict=True):
        v = np.int64(origin[p.axis]) + (r if p.axis == outer else c if p.axis == inner else np.int64(0))
        v = np.broadcast_to(v, (rows, SPAN))
        inside &= (v >= 0) & (v < size_of(bound, sizes))
        coords[p.axis] = v
    safe = {a: np.where(inside, v, 0) for a, v in coords.items()}
    values = read(name, access, safe, sizes, mem, lw.index_width, where)
    zero = mem.field.const(Fraction(0))
    smem[(dst + tma_box_bytes(rows, SPAN, 2, lw.qk_desc.swizzle)) // 2] = np.where(inside, values, zero)


def _run_block(name: str, lw: AttentionWgmmaLowering, sizes: Mapping[str, int], mem: Memory, x: int) -> None:
    f = mem.field
    ops = _FieldOps(f)
    k, ring = lw.kernel, lw.ring
    assert ring is not None
    qt, flat = int(lw.query_tile(x, sizes)), int(lw.batch_flat(x, sizes))
    coords = {a: int(v) for a, v in lw.batch_coords(flat, sizes).items()}

    def where(bad: np.ndarray) -> str:
        return f"block {x} (query tile {qt}, batch element {flat})"

    n_e, n_d = sizes[lw.red_extent], sizes[lw.col_extent]
    zero = f.const(Fraction(0))
    smem = np.broadcast_to(zero, (lw.content_bytes // 2,)).copy()
    scale = None if lw.scale is None else eval_pointwise(lw.scale, lambda ld: None, f, sizes)
    limit = _key_limit(lw, qt, coords, sizes, mem)
    tiles = int(lw.kv_tiles(limit, sizes, lambda v, lo, hi: min(max(v, lo), hi)))
    open_limit = _open_limit(lw, qt, coords, sizes, mem)
    # the producer: Q's boxes, then each KV tile's boxes into the stage the ring is at
    for b in range(lw.q_boxes):
        _tma_load(name, lw, lw.q, lw.q_box_origin(qt, coords, b), int(lw.q_box_dst(b)), smem, sizes, mem, where)
    produced, p_state = 0, (ring.start_stage, ring.start_phase)

    def produce_until(t_last: int) -> None:
        nonlocal produced, p_state
        while produced <= min(t_last, tiles - 1):
            stage = p_state[0]
            for b in range(lw.q_boxes):
                _tma_load(name, lw, lw.k, lw.k_box_origin(produced, coords, b), int(lw.k_box_dst(stage, b)), smem,
                          sizes, mem, where)
            for b in range(lw.v_boxes):
                _tma_load(name, lw, lw.v, lw.v_box_origin(produced, coords, b), int(lw.v_box_dst(stage, b)), smem,
                          sizes, mem, where)
            p_state = ring.advance(*p_state)
            produced += 1

    W, L = 4, 32
    w5 = np.arange(W, dtype=np.int64)[:, None, None, None, None]
    l5 = np.arange(L, dtype=np.int64)[None, :, None, None, None]
    h5 = np.arange(lw.fragment.halves, dtype=np.int64)[None, None, None, :, None]
    q5 = np.arange(lw.fragment.pair, dtype=np.int64)[None, None, None, None, :]
    j5 = np.arange(lw.score_groups, dtype=np.int64)[None, None, :, None, None]
    dn5 = np.arange(lw.out_groups, dtype=np.int64)[None, None, :, None, None]
    w3, l3 = np.arange(W)[:, None, None], np.arange(L)[None, :, None]
    lanes = np.arange(L, dtype=np.int64)
    s_reg5 = np.broadcast_to(np.asarray(lw.s_register(j5, h5, q5), dtype=np.int64), (W, L, lw.score_groups, lw.fragment.halves, lw.fragment.pair))
    o_reg5 = np.broadcast_to(np.asarray(lw.o_register(dn5, h5, q5), dtype=np.int64), (W, L, lw.out_groups, lw.fragment.halves, lw.fragment.pair))
    wb5, lb5 = np.broadcast_to(w5, s_reg5.shape), np.broadcast_to(l5, s_reg5.shape)
    wo5, lo5 = np.broadcast_to(w5, o_reg5.shape), np.broadcast_to(l5, o_reg5.shape)
    # the instruction's accumulator elements (S: m64n{bn}, O: m64n{#D}) by register
    s_row, s_col = instruction_element("wgmma", w3, l3, np.arange(k.bn // 2)[None, None, :])
    o_row, o_col = instruction_element("wgmma", w3, l3, np.arange(n_d // 2)[None, None, :])
    a_w = np.arange(W)[:, None, None, None]
    a_l = np.arange(L)[None, :, None, None]
    a_r = np.arange(4)[None, None, :, None]
    a_h = np.arange(2)[None, None, None, :]
    a_row, a_col = (np.broadcast_to(v, (W, L, 4, 2)) for v in wgmma_a_element(a_w, a_l, a_r, a_h))
    desc = lw.qk_desc
    maps = {"w5": w5, "l5": l5, "h5": h5, "q5": q5, "j5": j5, "wb5": wb5, "lb5": lb5, "s_reg5": s_reg5, "wo5": wo5,
            "lo5": lo5, "o_reg5": o_reg5, "s_row": s_row, "s_col": s_col, "o_row": o_row, "o_col": o_col,
            "a_row": a_row, "a_col": a_col}
    states = []
    for cw in range(lw.consumers):
        # Q's A operand of this slab, all k steps: (64, #E), once Q's barrier has completed
        a_q = np.concatenate([smem[wgmma_kmajor_addresses(int(lw.q_start(cw, kk)), SLAB, K_STEP, desc.sbo,
                                                          desc.swizzle) // 2] for kk in range(n_e // K_STEP)], axis=1)
        states.append({"m": np.broadcast_to(f.const(Fraction(1)), (W, L, 2)).copy(),  # the empty maximum
                       "l": np.broadcast_to(zero, (W, L, 2)).copy(), "o": np.broadcast_to(zero, (W, L, n_d // 2)).copy(),
                       "a_q": a_q, "ring": (ring.start_stage, ring.start_phase)})
    kt = int(lw.first_tile())
    while kt < tiles:  # the KV loop: from the lowering's first tile, a step of `next_tile`
        # the producer fills every stage the tiles before kt have left (the consumers run in order here; when the
        # ring lets each load begin is the pipeline-schedule rule's): a stage index that repeats too early
        # overwrites tile kt before it is read
        produce_until(kt + ring.stages - 1)
        for cw, st in enumerate(states):  # every consumer reads tile kt before any stage is refilled
            _consume(lw, f, ops, smem, st, cw, qt, kt, coords, sizes, mem, open_limit, scale, maps)
        kt = int(lw.next_tile(kt))
    for cw, st in enumerate(states):
        l_run, o = st["l"], st["o"]
        for off in lw.quad_offsets:
            l_run = f.op("add", [l_run, l_run[:, lanes ^ off, :]])
        o_g = o[wo5, lo5, o_reg5]
        inv = f.op("div0", [np.broadcast_to(f.const(Fraction(1)), l_run.shape), l_run])  # 1 / l once a row
        out = f.op("mul", [o_g, np.broadcast_to(inv[:, :, None, :, None], o_g.shape)])
        rows, cols = lw.o_element(cw, w5, l5, dn5, h5, q5)
        at = {**{a: np.int64(v) for a, v in coords.items()},
              "i": np.broadcast_to(lw.row(qt, rows), out.shape), "d": np.broadcast_to(cols, out.shape)}
        write(name, lw.out, at, out, sizes, mem, lw.index_width, False, None, where)


def _consume(lw: AttentionWgmmaLowering, f, ops: _FieldOps, smem: np.ndarray, st: dict, cw: int, qt: int, kt: int,
             coords: Mapping[str, int], sizes: Mapping[str, int], mem: Memory, open_limit: int, scale, maps: dict
             ) -> None:
    """Consumer cw's step over KV tile kt: S by wgmma, the online softmax on its registers, O += P·V."""
    k, ring = lw.kernel, lw.ring
    assert ring is not None
    n_e, n_d = sizes[lw.red_extent], sizes[lw.col_extent]
    desc, vdesc = lw.qk_desc, lw.v_desc
    zero, neg_inf = f.const(Fraction(0)), f.neg_inf()
    W, L = 4, 32
    lanes = np.arange(L, dtype=np.int64)
    w5, l5, h5, q5, j5 = maps["w5"], maps["l5"], maps["h5"], maps["q5"], maps["j5"]
    wb5, lb5, s_reg5, wo5, lo5, o_reg5 = (maps[x] for x in ("wb5", "lb5", "s_reg5", "wo5", "lo5", "o_reg5"))
    s_row, s_col, o_row, o_col, a_row, a_col = (maps[x] for x in ("s_row", "s_col", "o_row", "o_col", "a_row", "a_col"))
    m, l_run, o = st["m"], st["l"], st["o"]
    slot = int(ring.read_slot(st["ring"][0]))
    b_k = np.concatenate([smem[wgmma_kmajor_addresses(int(lw.k_start(slot, kk)), k.bn, K_STEP, desc.sbo,
                                                      desc.swizzle) // 2] for kk in range(n_e // K_STEP)], axis=1)
    s_full = f.contract([st["a_q"], b_k], "ie,je->ij")  # (64, bn)
    s_vals = s_full[s_row, s_col]  # (W, L, bn/2): the registers
    s = s_vals[wb5, lb5, s_reg5]  # (W, L, j, h, q) by the lowering's register map
    fold = lw.scale_in_exponent(sizes)  # the scale in the exponent: the max of the raw scores
    if scale is not None and not fold:
        s = f.op("mul", [s, np.broadcast_to(scale, s.shape)])
    rows, keys = lw.s_element(cw, w5, l5, j5, h5, q5)
    i_at, j_at = lw.row(qt, rows), lw.key(kt, keys)
    visible = np.asarray(lw.key_inside(j_at, sizes))
    if bool(lw.unmasked(kt, open_limit, sizes, lambda a, b: a and b)):
        visible = np.ones_like(visible)  # the kernel applies no mask to this tile
    elif lw.mask is not None:
        at = {**{a: np.int64(v) for a, v in coords.items()}, "i": i_at, "j": j_at}
        visible = visible & condition_holds(lw.mask, at, sizes, mem)
    visible = np.broadcast_to(visible, s.shape)
    s = np.where(visible, s, neg_inf)
    mx = f.reduce("max", np.moveaxis(s, 2, 3), (3, 4))  # (W, L, h): the lane's registers
    for off in lw.quad_offsets:  # the row's lanes (xor shuffles)
        mx = ops.max(mx, mx[:, lanes ^ off, :])
    m_new = lw.running_max(m, mx, ops)
    if fold and scale is not None:  # shift = m_new·c, alpha = exp((m − m_new)·c), P = exp(s·c − shift)
        shift = f.op("mul", [m_new, np.broadcast_to(scale, m_new.shape)])
        alpha = f.op("exp", [f.op("mul", [lw.rescale(m, m_new, ops), np.broadcast_to(scale, m.shape)])])
        s_exp = f.op("mul", [s, np.broadcast_to(scale, s.shape)])
    else:
        shift, s_exp = m_new, s
        alpha = f.op("exp", [lw.rescale(m, m_new, ops)])
    st["m"] = lw.kept_max(m, m_new)
    l_run = f.op("mul", [l_run, alpha])
    o_g = o[wo5, lo5, o_reg5]
    o[wo5, lo5, o_reg5] = f.op("mul", [o_g, np.broadcast_to(alpha[:, :, None, :, None], o_g.shape)])
    shifted = f.op("sub", [s_exp, np.broadcast_to(shift[:, :, None, :, None], s.shape)])
    p = np.where(visible, f.op("exp", [shifted]), zero)
    st["l"] = f.op("add", [l_run, f.reduce("sum", np.moveaxis(p, 2, 3), (3, 4))])
    p_flat = np.broadcast_to(zero, (W, L, k.bn // 2)).copy()
    p_flat[wb5, lb5, s_reg5] = p  # P in S's registers
    # P's A operand: register reg of k step kk packs the S registers `p_registers` names
    a_p = np.broadcast_to(zero, (SLAB, k.bn)).copy()
    for kk in range(k.bn // K_STEP):
        for reg in range(4):
            for half, src in enumerate(lw.p_registers(kk, reg)):
                a_p[a_row[:, :, reg, half], kk * K_STEP + a_col[:, :, reg, half]] = p_flat[:, :, int(src)]
    b_v = np.concatenate([smem[wgmma_mnmajor_addresses(int(lw.v_start(slot, kk)), n_d, K_STEP, vdesc.lbo,
                                                       vdesc.sbo, vdesc.swizzle) // 2]
                          for kk in range(k.bn // K_STEP)], axis=1)  # (#D, bn): element (d, key)
    pv = f.contract([a_p, b_v], "ij,dj->id")
    st["o"] = f.op("add", [o, pv[o_row, o_col]])
    st["ring"] = ring.advance(*st["ring"])


register_kind(AttentionWgmmaLowering, KindProof(run=run_attention_wgmma, final_selection=_final,
                                                box_selection=_box, tiled_axes=_tiled_axes,
                                                frozen_extents=_frozen, exp_field=True))

__all__ = ["run_attention_wgmma", "wgmma_a_element"]
