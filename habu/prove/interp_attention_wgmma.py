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
below), and O is stored from `o_element`. A persistent block (`_Block`) walks its work tiles with one shared
memory, one ring and one pair of Q barriers: the producer as far ahead as its barriers allow, so a Q freed too
early is overwritten by the next tile's before the last S reads it. What is not modelled: the float guard `softmax_shift` (as for
mma.sync), and the timing of the ring, which the `pipeline-schedule` rule runs (habu.prove.pipeline).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np

from habu.lower.access import size_of
from habu.lower.attention_wgmma import K_STEP, SLAB, SPAN, AttentionWgmmaLowering
from habu.prove.conditions import condition_holds
from habu.prove.fragments import (
    instruction_element,
    tma_box_bytes,
    wgmma_kmajor_addresses,
    wgmma_mnmajor_addresses,
)
from habu.prove.interp import Memory, eval_pointwise, read, write
from habu.prove.interp_attention import (
    _final,
    _frozen,
    _key_limit,
    _open_limit,
    _tiled_axes,
    store_statistics,
)
from habu.prove.interp_attention_split import SplitRun
from habu.prove.kinds import KindProof, register_kind
from habu.prove.pipeline import Barrier

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
    """Each selected block: one work tile, or (persistent) a block of the check's grid (`check_blocks`) walking
    its work tiles with one shared memory, one ring and one Q barrier pair across them."""
    grid = check_blocks(lw, sizes) if lw.persistent else 0
    split = SplitRun(lw, sizes, mem) if lw.kernel.kv_split else None
    for x in blocks:
        _Block(name, lw, sizes, mem, int(x), grid, split).run()
    if split is not None:
        split.finish(name)


# The grid a persistent kernel is checked at: the grid of a GPU of this many SMs (at least), so that the blocks of
# a small witness walk several work tiles each, the ring and Q's handoff running on across them (the kernel reads
# gridDim.x: every grid's walk is the `attention-persistent-walk` rule's); at most `CHECK_TILES` tiles a block
CHECK_SLOTS, CHECK_TILES = 3, 4


def check_blocks(lw: AttentionWgmmaLowering, sizes: Mapping[str, int]) -> int:
    work = int(lw.work_tiles(sizes))
    return int(lw.persistent_blocks(work, max(CHECK_SLOTS, -(-work // CHECK_TILES))))


def walk(lw: AttentionWgmmaLowering, block: int, blocks: int, work: int) -> list[int]:
    """The work tiles block `block` of a grid of `blocks` takes (`work_of(block, n, blocks)`, n = 0, 1, ...), as the
    kernel walks them; a walk that does not move forward ends at its first repeat (the kernel would loop
    forever)."""
    out, w = [], int(lw.work_of(block, 0, blocks))
    while 0 <= w < work and w not in out and len(out) <= work:
        out.append(w)
        w = int(lw.work_of(block, len(out), blocks))
    return out


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


def _maps(lw: AttentionWgmmaLowering, k, n_d: int) -> dict:
    """The register maps of a consumer warpgroup (the lowering's and the instruction's), by name."""
    W, L = 4, 32
    w5 = np.arange(W, dtype=np.int64)[:, None, None, None, None]
    l5 = np.arange(L, dtype=np.int64)[None, :, None, None, None]
    h5 = np.arange(lw.fragment.halves, dtype=np.int64)[None, None, None, :, None]
    q5 = np.arange(lw.fragment.pair, dtype=np.int64)[None, None, None, None, :]
    j5 = np.arange(lw.score_groups, dtype=np.int64)[None, None, :, None, None]
    dn5 = np.arange(lw.out_groups, dtype=np.int64)[None, None, :, None, None]
    w3, l3 = np.arange(W)[:, None, None], np.arange(L)[None, :, None]
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
    return {"w5": w5, "l5": l5, "h5": h5, "q5": q5, "j5": j5, "dn5": dn5, "wb5": wb5, "lb5": lb5, "s_reg5": s_reg5,
            "wo5": wo5, "lo5": lo5, "o_reg5": o_reg5, "s_row": s_row, "s_col": s_col, "o_row": o_row, "o_col": o_col,
            "a_row": a_row, "a_col": a_col}


class _Deadlock(Exception):
    pass


class _Block:
    """One block: a work tile, or a persistent block's walk (`walk`) over several. The producer runs as far ahead as
    its barriers let it (`_produce`, after every consumer step that frees something): Q's boxes of the block's n-th
    tile once the Q-empty barrier's phase n − 1 has completed (`q_free_parity`), each KV tile's boxes into the stage
    the ring is at once the tile S stages before has been released (the ring's order of stages is the
    `pipeline-schedule` rule's); the consumers step in lockstep (every warpgroup the same step), Q's barrier and Q's
    empty barrier with the mbarrier semantics (habu.prove.pipeline.Barrier). A wait that the producer, as far ahead
    as it can go, does not satisfy is a deadlock (a fault); a Q freed before the tile's last S lets the producer
    overwrite it with the next tile's."""

    def __init__(self, name: str, lw: AttentionWgmmaLowering, sizes: Mapping[str, int], mem: Memory, x: int,
                 grid: int, split: SplitRun | None = None):
        self.name, self.lw, self.sizes, self.mem, self.x = name, lw, sizes, mem, x
        self.split = split  # split-KV: the launch's workspaces; block x is split `split_no` of work tile `rest`
        split_no, rest = (int(v) for v in lw.block_split(x, sizes))
        self.split_no, self.first = split_no, int(lw.first_tile(split_no))
        f = self.f = mem.field
        self.ops = _FieldOps(f)
        assert lw.ring is not None
        self.ring = lw.ring
        self.tiles = walk(lw, x, grid, int(lw.work_tiles(sizes))) if grid else [rest]
        self.smem = np.broadcast_to(f.const(Fraction(0)), (lw.content_bytes // 2,)).copy()
        self.scale = None if lw.scale is None else eval_pointwise(lw.scale, lambda ld: None, f, sizes)
        self.maps = _maps(lw, lw.kernel, sizes[lw.col_extent])
        self.info = [self._tile_info(w) for w in self.tiles]
        # the producer: its place in its sequence (work tile, KV tile of it or -1 for Q), the ring's state
        self.p_tile, self.p_kv, self.p_state, self.produced = 0, -1, (self.ring.start_stage, self.ring.start_phase), 0
        self.released = 0  # KV tiles every consumer has released (in order)
        self.q_full = Barrier(1)  # Q's barrier: one arrival (the producer's expect_tx), its bytes land at once
        self.q_empty = Barrier(max(1, lw.consumers))  # every consumer warpgroup arrives once a tile

    def _tile_info(self, w: int) -> dict:
        lw, sizes, mem = self.lw, self.sizes, self.mem
        qt, flat = int(lw.query_tile(w, sizes)), int(lw.batch_flat(w, sizes))
        coords = {a: int(v) for a, v in lw.batch_coords(flat, sizes).items()}
        limit = _key_limit(lw, qt, coords, sizes, mem)
        return {"w": w, "qt": qt, "flat": flat, "coords": coords, "open": _open_limit(lw, qt, coords, sizes, mem),
                "tiles": int(lw.end_tile(self.split_no, lw.kv_tiles(limit, sizes,
                                                                     lambda v, lo, hi: min(max(v, lo), hi))))}

    def where(self, info: dict):
        text = f"block {self.x} (work tile {info['w']}: query tile {info['qt']}, batch element {info['flat']}" + \
            (f", split {self.split_no})" if self.split is not None else ")")
        return lambda bad: text

    # -- the producer
    def _produce(self) -> None:
        lw, ring = self.lw, self.ring
        while self.p_tile < len(self.info):
            info = self.info[self.p_tile]
            if self.p_kv < 0:  # the tile's Q: after the consumers freed the last one
                n = self.p_tile
                if n > 0 and not self.q_empty.completed(int(lw.q_free_parity(n))):
                    return
                for b in range(lw.q_boxes):
                    _tma_load(self.name, lw, lw.q, lw.q_box_origin(info["qt"], info["coords"], b), int(lw.q_box_dst(b)),
                              self.smem, self.sizes, self.mem, self.where(info))
                self.q_full.pending -= 1
                self.q_full.settle()
                self.p_kv = self.first
                continue
            if self.p_kv >= info["tiles"]:  # the emitted producer loop: ++kt below the tile's KV tiles
                self.p_tile, self.p_kv = self.p_tile + 1, -1
                continue
            if self.produced >= ring.stages and self.released < self.produced - ring.stages + 1:
                return  # the stage's last tile is still read
            stage = self.p_state[0]
            for b in range(lw.q_boxes):
                _tma_load(self.name, lw, lw.k, lw.k_box_origin(self.p_kv, info["coords"], b),
                          int(lw.k_box_dst(stage, b)), self.smem, self.sizes, self.mem, self.where(info))
            for b in range(lw.v_boxes):
                _tma_load(self.name, lw, lw.v, lw.v_box_origin(self.p_kv, info["coords"], b),
                          int(lw.v_box_dst(stage, b)), self.smem, self.sizes, self.mem, self.where(info))
            self.p_state = ring.advance(*self.p_state)
            self.produced += 1
            self.p_kv += 1

    def _free_q(self, done: int, tiles: int) -> None:
        """Every consumer's arrival on Q-empty where `q_released(done, tiles)` holds (a persistent kernel's)."""
        if self.lw.persistent and bool(self.lw.q_released(done, tiles)):
            for _ in range(self.lw.consumers):
                self.q_empty.pending -= 1
            self.q_empty.settle()
            self._produce()

    def _deadlock(self, info: dict, what: str) -> None:
        self.mem.fault(f"{self.name}: {self.where(info)(None)}: the consumers wait for {what}, which the producer "
                       "never delivers (a deadlock)")
        raise _Deadlock

    # -- the consumers
    def run(self) -> None:
        self._produce()
        states = [{"ring": (self.ring.start_stage, self.ring.start_phase)} for _ in range(self.lw.consumers)]
        consumed = 0
        try:
            for n, info in enumerate(self.info):
                consumed = self._tile(n, info, states, consumed)
        except _Deadlock:
            return

    def _tile(self, n: int, info: dict, states: list[dict], consumed: int) -> int:
        lw, f, sizes = self.lw, self.f, self.sizes
        n_e, n_d = sizes[lw.red_extent], sizes[lw.col_extent]
        zero = f.const(Fraction(0))
        W, L = 4, 32
        if not self.q_full.completed(int(lw.q_full_parity(n))):
            self._deadlock(info, "the tile's Q")
        for st in states:  # the empty maximum, l and O
            st.update(m=np.broadcast_to(f.const(Fraction(1)), (W, L, 2)).copy(), l=np.broadcast_to(zero, (W, L, 2)).copy(),
                      o=np.broadcast_to(zero, (W, L, n_d // 2)).copy())
        tiles = info["tiles"]
        self._free_q(0, tiles)
        kt = self.first
        # the KV loop: the emitted guard of the first S (`visits`), then a step of `next_tile` below the tiles
        while bool(lw.visits(self.first, tiles)) and (kt == self.first or kt < tiles):
            if self.produced <= consumed:
                self._deadlock(info, f"KV tile {kt}")
            for cw, st in enumerate(states):  # S = Q·Kᵀ: Q and the stage's K as they are now
                st["a_q"] = np.concatenate([self.smem[wgmma_kmajor_addresses(int(lw.q_start(cw, kk)), SLAB, K_STEP,
                                                                             lw.qk_desc.sbo, lw.qk_desc.swizzle) // 2]
                                            for kk in range(n_e // K_STEP)], axis=1)
                _scores(lw, f, self.smem, st, sizes)
            self._free_q(int(lw.s_completed(kt)), tiles)
            for cw, st in enumerate(states):  # the softmax, O += P·V, the stage released
                _accumulate(lw, f, self.ops, self.smem, st, cw, info["qt"], kt, info["coords"], sizes, self.mem,
                            info["open"], self.scale, self.maps)
            consumed += 1
            self.released += 1
            self._produce()
            kt = int(lw.next_tile(kt))
        self._store(info, states)
        return consumed

    def _store(self, info: dict, states: list[dict]) -> None:
        lw, f, mp = self.lw, self.f, self.maps
        lanes = np.arange(32, dtype=np.int64)
        w5, l5, h5, q5, dn5 = mp["w5"], mp["l5"], mp["h5"], mp["q5"], mp["dn5"]
        wo5, lo5, o_reg5 = mp["wo5"], mp["lo5"], mp["o_reg5"]
        for cw, st in enumerate(states):
            l_run, o = st["l"], st["o"]
            for off in lw.quad_offsets:
                l_run = f.op("add", [l_run, l_run[:, lanes ^ off, :]])
            o_g = o[wo5, lo5, o_reg5]
            inv = f.op("div0", [np.broadcast_to(f.const(Fraction(1)), l_run.shape), l_run])  # 1 / l once a row
            out = f.op("mul", [o_g, np.broadcast_to(inv[:, :, None, :, None], o_g.shape)])
            rows, cols = lw.o_element(cw, w5, l5, dn5, h5, q5)
            if self.split is not None:  # the partial: O unnormalised, m (scaled where the kernel keeps raw maxima), l
                m = st["m"]
                if lw.partial_max_scaled(self.sizes):
                    m = f.op("mul", [m, np.broadcast_to(self.scale, m.shape)])
                m_row = lw.o_element(cw, w5[..., 0, 0], l5[..., 0, 0], 0, np.arange(2)[None, None, :], 0)[0]
                m_row = np.broadcast_to(m_row, m.shape)
                self.split.store(self.name, self.split_no, info["flat"], info["qt"], o_g, rows, cols, m, l_run, m_row,
                                 self.where(info)(None))
                continue
            if lw.out_vectors is not None:  # the lanes trade column pairs, then store whole vectors
                out, rows, cols = _exchanged_values(lw, cw, out, self.mem)
            at = {**{a: np.int64(v) for a, v in info["coords"].items()},
                  "i": np.broadcast_to(lw.row(info["qt"], rows), out.shape), "d": np.broadcast_to(cols, out.shape)}
            write(self.name, lw.out, at, out, self.sizes, self.mem, lw.index_width, False, None, self.where(info))
            stat_rows = lw.consumer_stat_row(cw, w5[..., 0, 0], l5[..., 0, 0], np.arange(2)[None, None, :])
            store_statistics(self.name, lw, self.sizes, self.mem, {a: np.int64(v) for a, v in info["coords"].items()},
                             lw.row(info["qt"], stat_rows), l5[..., 0, 0], st["m"], l_run, self.where(info))
        if self.split is not None:  # the consumers count the block; the query tile's last split combines
            coords = {a: np.int64(v) for a, v in info["coords"].items()}
            self.split.arrive(self.name, info["flat"], info["qt"], coords, self.ops, self.where(info)(None))


def _exchanged_values(lw: AttentionWgmmaLowering, cw: int, out: np.ndarray,
                      mem: Memory) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """O's values (W, L, groups, halves, pair) as the vector epilogue stores them (habu/lower/quad_vectors.py):
    per set u and round r each lane sends its pair of `sent_group(u, l, r)` and receives lane l ^ `offset(r)`'s
    (shfl.sync.bfly), which fills slot `slot(l, r)` of its vector. Returns the values, rows and columns, each of
    shape (W, L, sets, halves, words, pair); a slot no round fills, or two fill, is a fault (it keeps poison)."""
    qv = lw.out_vectors
    assert qv is not None
    W, L, _, halves, pair = out.shape
    lanes = np.arange(L, dtype=np.int64)
    vals = np.broadcast_to(mem.poison(np.arange(L, dtype=np.int64))[None, :, None, None, None, None],
                           (W, L, qv.sets, halves, qv.words, pair)).astype(out.dtype)
    filled = np.zeros((L, qv.sets, qv.words), dtype=np.int64)
    for u in range(qv.sets):
        for r in qv.rounds:
            sent = out[:, lanes, np.asarray(qv.sent_group(u, lanes, r), dtype=np.int64)]  # (W, L, halves, pair)
            got = sent[:, lanes ^ qv.offset(r)]  # lane l's: what lane l ^ offset sent
            slot = np.asarray(qv.slot(lanes, r), dtype=np.int64)
            vals[:, lanes, u, :, slot, :] = np.moveaxis(got, 1, 0)  # advanced indices first: (L, W, halves, pair)
            filled[lanes, u, slot] += 1
    if np.any(filled != 1):
        mem.fault(f"the O vectors' exchange fills a slot {int(filled.min())}..{int(filled.max())} times (once each)")
    shape = vals.shape
    w6, l6, u6, h6, s6, q6 = (np.arange(n, dtype=np.int64).reshape([n if a == b else 1 for b in range(6)])
                              for a, n in enumerate(shape))
    rows, cols = lw.o_vector_element(cw, w6, l6, u6, h6, s6, q6)
    return vals, np.broadcast_to(rows, shape), np.broadcast_to(cols, shape)


def _scores(lw: AttentionWgmmaLowering, f, smem: np.ndarray, st: dict, sizes: Mapping[str, int]) -> None:
    """S = Q·Kᵀ of a consumer's slab (its Q operand `a_q`) with the K tile of the stage its ring is at."""
    desc = lw.qk_desc
    n_e = sizes[lw.red_extent]
    slot = int(lw.ring.read_slot(st["ring"][0]))  # type: ignore[union-attr]
    b_k = np.concatenate([smem[wgmma_kmajor_addresses(int(lw.k_start(slot, kk)), lw.kernel.bn, K_STEP, desc.sbo,
                                                      desc.swizzle) // 2] for kk in range(n_e // K_STEP)], axis=1)
    st["s"] = f.contract([st["a_q"], b_k], "ie,je->ij")  # (64, bn)


def _accumulate(lw: AttentionWgmmaLowering, f, ops: _FieldOps, smem: np.ndarray, st: dict, cw: int, qt: int, kt: int,
                coords: Mapping[str, int], sizes: Mapping[str, int], mem: Memory, open_limit: int, scale, maps: dict
                ) -> None:
    """Consumer cw's step over KV tile kt once its S is in `st`: the online softmax on its registers, O += P·V, the
    ring's state advanced."""
    k, ring = lw.kernel, lw.ring
    assert ring is not None
    n_d = sizes[lw.col_extent]
    vdesc = lw.v_desc
    zero, neg_inf = f.const(Fraction(0)), f.neg_inf()
    W, L = 4, 32
    lanes = np.arange(L, dtype=np.int64)
    w5, l5, h5, q5, j5 = maps["w5"], maps["l5"], maps["h5"], maps["q5"], maps["j5"]
    wb5, lb5, s_reg5, wo5, lo5, o_reg5 = (maps[x] for x in ("wb5", "lb5", "s_reg5", "wo5", "lo5", "o_reg5"))
    s_row, s_col, o_row, o_col, a_row, a_col = (maps[x] for x in ("s_row", "s_col", "o_row", "o_col", "a_row", "a_col"))
    m, l_run, o = st["m"], st["l"], st["o"]
    slot = int(ring.read_slot(st["ring"][0]))
    s_full = st["s"]
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
    st["l"] = f.op("add", [l_run, _chained_sums(lw, k.sum_chains, p, zero, f, mem)])
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


def _chained_sums(lw: AttentionWgmmaLowering, chains: int, p: np.ndarray, zero: Any, f: Any, mem: Memory) -> np.ndarray:
    """Each row half's sum of the tile's weights `p` (W, L, j, h, q) as the kernel takes it: group j of half h
    added into slot `chain_slot(chain_of(j), h)` of the thread's array, then the slots of the chains `chains_joined`
    lists added (W, L, h). (One chain: l itself, slot h.)"""
    halves = lw.fragment.halves
    groups = np.arange(p.shape[2], dtype=np.int64)[:, None]
    slot = np.broadcast_to(np.asarray(lw.chain_slot(lw.chain_of(groups, chains), np.arange(halves)[None, :])),
                           (p.shape[2], halves))
    count = lw.chain_slots(chains)
    if slot.min() < 0 or slot.max() >= count:
        mem.fault(f"a softmax sum chain's slot {int(slot.min())}..{int(slot.max())} lies outside its {count}")
    by_group = f.reduce("sum", p, (4,))  # (W, L, j, h)
    slots = [f.reduce("sum", np.where((slot == x)[None, None], by_group, zero), (2, 3)) for x in range(count)]
    out = []
    for h in range(halves):
        total = f.op("sub", [slots[0], slots[0]])
        for ch in lw.chains_joined(chains):
            x = int(lw.chain_slot(ch, h))
            if not 0 <= x < count:
                mem.fault(f"the softmax's sum joins slot {x} of its {count}")
                continue
            total = f.op("add", [total, slots[x]])
        out.append(total)
    return np.stack(out, axis=-1)


def _final_wgmma(lw: AttentionWgmmaLowering, sizes: Mapping[str, int]) -> tuple[object, tuple[np.ndarray, ...], str]:
    """The FA2 kernel's sample (`_final`: its work tiles and their output box); persistent: the blocks of the
    check's grid whose walks take those tiles, each run over its whole walk."""
    tiles, box, text = _final(lw, sizes)
    if not lw.persistent:
        return tiles, box, text
    grid, work = check_blocks(lw, sizes), int(lw.work_tiles(sizes))
    wanted = set(tiles)  # type: ignore[call-overload]
    owners = [b for b in range(grid) if wanted & set(walk(lw, b, grid, work))]
    return owners, box, (f"{len(owners)} of {grid} persistent blocks (the check's grid; {work} work tiles), each its "
                         f"whole walk: {text}")


def _box_wgmma(lw: AttentionWgmmaLowering, box: tuple[np.ndarray, ...], sizes: Mapping[str, int]
               ) -> tuple[object, object, str]:
    blocks, _, text = _final_wgmma(lw, sizes)
    return blocks, None, text


register_kind(AttentionWgmmaLowering, KindProof(run=run_attention_wgmma, final_selection=_final_wgmma,
                                                box_selection=_box_wgmma, tiled_axes=_tiled_axes,
                                                frozen_extents=_frozen, exp_field=True,
                                                length_ranges=lambda lw: lw.mask_ranges))

__all__ = ["run_attention_wgmma", "wgmma_a_element"]
