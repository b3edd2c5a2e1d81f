"""Planted mistakes in the fused attention kernel's wgmma main loop (habu/lower/attention_wgmma.py): the online
softmax's rescale, the row half of P's register A operand, the stage a KV tile's boxes land in, V's
descriptor, the split decode's partials, O's vector exchange (habu/lower/quad_vectors.py) and the slots and
join of the softmax's sum chains. Each changes the CUDA the emitter prints (the same methods print it); the finite-field check over
Z_q × GF(p) must reject every one on the CPU. They are entries of the mutation suite (`MUTANTS` in
habu/bench/mutants.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from habu.lower.attention_wgmma import AttentionWgmmaLowering
from habu.lower.quad_vectors import QuadVectors

# examples/attention.habu with the smallest head width the loop takes (64): 2 query tiles of 64 rows (one
# consumer warpgroup), 4 KV tiles of 32 keys in 2 stages (the ring wraps twice), the causal skip and mask
SHAPE = {"B": 1, "G": 1, "R": 2, "I": 70, "J": 100, "E": 64, "D": 64}
PINS = {"family": "attention", "main_loop": "wgmma", "bm": "64", "bn": "32", "stages": "2"}


def _planted(lw: Any, method: str, body: Callable) -> AttentionWgmmaLowering:
    assert isinstance(lw, AttentionWgmmaLowering)
    cls = type(f"Planted_{method}", (AttentionWgmmaLowering,), {method: body})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def rescale_inverted(lw: Any) -> AttentionWgmmaLowering:
    """l and O multiplied by exp(m_new − m_old): earlier tiles grow instead of shrinking."""
    return _planted(lw, "rescale", lambda self, m_old, m_new, ops: ops.sub(m_new, m_old))


def statistics_row_half_swapped(lw: Any) -> AttentionWgmmaLowering:
    """A training forward's row statistics stored at the lane's other row half (rows g and g + 8 swapped)."""
    return _planted(lw, "consumer_stat_row", lambda self, cw, warp, lane, h:
                    AttentionWgmmaLowering.consumer_stat_row(self, cw, warp, lane, 1 - h))


def p_row_swapped(lw: Any) -> AttentionWgmmaLowering:
    """P's A registers take the S accumulators of the other row half (rows g and g + 8 swapped)."""
    def p_registers(self, kk, reg):
        (g0, r0), (g1, r1) = self.p_fragment(kk, reg)
        return self.s_register(g0, 1 - r0 // 2, r0 % 2), self.s_register(g1, 1 - r1 // 2, r1 % 2)

    return _planted(lw, "p_registers", p_registers)


def kv_boxes_in_one_stage(lw: Any) -> AttentionWgmmaLowering:
    """The producer loads every KV tile's K boxes into stage 0: the next tile overwrites the one the consumers
    are about to multiply."""
    return _planted(lw, "k_box_dst", lambda self, stage, box: self.stage_base(0) + box * (self.kernel.bn * 128))


def v_descriptor_rows_of_k(lw: Any) -> AttentionWgmmaLowering:
    """V's descriptor steps 8 keys by 512 bytes instead of 1024 (its 8-row atoms misread)."""
    return replace(lw, v_desc=replace(lw.v_desc, sbo=lw.v_desc.sbo // 2))


def score_groups_short(lw: Any) -> AttentionWgmmaLowering:
    """The softmax's register loops stop one 8-key group short (`score_groups` − 1): the last group's scores
    are never scaled, masked or exponentiated."""
    cls = type("Planted_score_groups", (AttentionWgmmaLowering,),
               {"score_groups": property(lambda self: self.kernel.bn // 8 - 1)})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def kv_loop_skips_a_tile(lw: Any) -> AttentionWgmmaLowering:
    """The consumers' KV loop steps two tiles (`next_tile` kt + 2): every other tile's keys are never seen."""
    return _planted(lw, "next_tile", lambda self, kt: kt + 2)


def head_major_blocks_repeat(lw: Any) -> AttentionWgmmaLowering:
    """With `head_major`, block x takes batch element x mod #tiles instead of x / #tiles: some (batch element,
    query tile) pairs get two blocks, others none (their rows are never written)."""
    return _planted(lw, "batch_flat", lambda self, x, sizes: x % self.query_tiles(sizes))


HEAD_MAJOR_PINS = {**PINS, "head_major": "1"}


# examples/decode_attention.habu on the wgmma loop split over its keys: 3 sequences (lengths drawn up to #J, half of
# them whole: `KindProof.length_ranges`), 2 KV heads of 2 query heads in one 64-row tile, 300 keys in KV tiles of 64,
# splits of 128 (3 splits, the last ragged); head width 64
DECODE_SHAPE = {"B": 3, "G": 2, "R": 2, "J": 300, "L": 301, "E": 64, "D": 64}
DECODE_PINS = {"family": "attention", "main_loop": "wgmma", "bm": "64", "bn": "64", "stages": "2", "kv_split": "128",
               "kv_warps": "1"}


def split_max_unscaled(lw: Any) -> AttentionWgmmaLowering:
    """A split keeps its raw scores' running max as its partial m: the combine weighs the splits by
    exp(m_s − M) of unscaled scores."""
    return _planted(lw, "partial_max_scaled", lambda self, sizes: False)


def split_guard_any_tile(lw: Any) -> AttentionWgmmaLowering:
    """The first S and the last P·V are guarded by `tiles > 0`: a split past a short sequence's last tile waits
    for a stage the producer never fills (session 35's hang on the H200)."""
    return _planted(lw, "visits", lambda self, first, tiles: tiles > 0)


def split_from_tile_zero(lw: Any) -> AttentionWgmmaLowering:
    """Every split starts at KV tile 0: the first keys are counted by every split."""
    return _planted(lw, "first_tile", lambda self, split=0: 0)


def _planted_vectors(lw: Any, method: str, body: Callable) -> AttentionWgmmaLowering:
    """The lowering with its O vectors' `method` planted (habu/lower/quad_vectors.py)."""
    qv = lw.out_vectors
    assert qv is not None, "the plan stores O one element at a time"
    planted = type(f"Planted_{method}", (QuadVectors,), {method: body})(qv.words, qv.groups, qv.fragment)
    return _planted(lw, "out_vectors", property(lambda self: planted))


def vector_slot_own(lw: Any) -> AttentionWgmmaLowering:
    """Every received pair fills the lane's own slot (t, not t ^ r): one slot written by every round, the others
    never."""
    return _planted_vectors(lw, "slot", lambda self, lane, r: self.lane_in_group(lane))


def vector_sends_own_group(lw: Any) -> AttentionWgmmaLowering:
    """Each lane sends its pair of its own vector's group (words·u + t) instead of the receiver's (t ^ r)."""
    return _planted_vectors(lw, "sent_group", lambda self, u, lane, r: self.words * u + self.lane_in_group(lane))


def vector_column_without_lane_group(lw: Any) -> AttentionWgmmaLowering:
    """The vector's column forgets the pairs of the trading groups before the lane's (8·group only): two lanes of
    a row store to one place, half the row's columns never."""
    return _planted_vectors(lw, "vector_column", lambda self, u, lane: 8 * self.vector_group(u, lane))


def vector_pair_swapped(lw: Any) -> AttentionWgmmaLowering:
    """A pair's two columns trade places in the vector (`position` q ^ 1): the emitter packs them the other way
    round, each column's value lands on its neighbour."""
    return _planted_vectors(lw, "position", lambda self, s, q: self.fragment.pair * s + (q ^ 1))


# three consumer warpgroups (bm 192, session 40): 3 query tiles' worth of rows in one tile of 192, KV tiles of 96 keys
THREE_PINS = {"family": "attention", "main_loop": "wgmma", "bm": "192", "bn": "96", "stages": "2"}
THREE_SHAPE = {"B": 1, "G": 1, "R": 2, "I": 200, "J": 300, "E": 64, "D": 64}


def third_slab_reads_the_first_q(lw: Any) -> AttentionWgmmaLowering:
    """Consumer warpgroup cw's Q operand starts at slab cw mod 2: right for one or two warpgroups, while the third
    multiplies the first's query rows (its O rows 128.. are the first slab's)."""
    from habu.lower.attention_wgmma import ROW_BYTES, SLAB

    def q_start(self, cw, kk):
        return self.q_offset + (kk // 4) * (self.kernel.bm * ROW_BYTES) + (cw % 2) * (SLAB * ROW_BYTES) + (kk % 4) * 32

    return _planted(lw, "q_start", q_start)


def sum_chain_left_out(lw: Any) -> AttentionWgmmaLowering:
    """With the tile's sums in two chains (`sum_chains`), the join adds only the first: the odd 8-key groups'
    exponentials never reach l."""
    return _planted(lw, "chains_joined", lambda self, chains: tuple(range(chains))[:-1] or (0,))


def sum_chain_slots_shared(lw: Any) -> AttentionWgmmaLowering:
    """The chains' slots not interleaved by row half (chain + half): chain 1 of the first row half and chain 0 of
    the second add into one slot, so each half's l takes some of the other's weights."""
    return _planted(lw, "chain_slot", lambda self, chain, half: chain + half)


CHAIN_PINS = {**PINS, "sum_chains": "2"}


MUTANT_ENTRIES: tuple[tuple[Any, ...], ...] = (
    ("attention-wgmma-sum-chain-left-out", "the wgmma attention loop's softmax joins one of its two sum chains into "
     "l", "attention.habu", "ATTENTION-GQA", SHAPE, sum_chain_left_out, CHAIN_PINS),
    ("attention-wgmma-sum-chain-slots-shared", "the wgmma attention loop's softmax keeps two row halves' sum chains "
     "in one slot", "attention.habu", "ATTENTION-GQA", SHAPE, sum_chain_slots_shared, CHAIN_PINS),
    ("attention-wgmma-statistics-row-half-swapped", "the wgmma attention loop stores a training forward's row "
     "statistics at the lane's other row half", "attention.habu", "ATTENTION-GQA:forward", SHAPE,
     statistics_row_half_swapped, PINS),
    ("attention-wgmma-third-slab-reads-the-first-q", "the wgmma attention loop's third consumer warpgroup (bm 192) "
     "multiplies the first one's Q rows", "attention.habu", "ATTENTION-GQA", THREE_SHAPE, third_slab_reads_the_first_q,
     THREE_PINS),
    ("attention-wgmma-vector-pair-swapped", "the wgmma attention epilogue's vectors hold each pair's columns the "
     "other way round", "attention.habu", "ATTENTION-GQA", SHAPE, vector_pair_swapped, PINS),
    ("attention-wgmma-vector-slot-own", "the wgmma attention epilogue's exchange fills the lane's own slot every "
     "round", "attention.habu", "ATTENTION-GQA", SHAPE, vector_slot_own, PINS),
    ("attention-wgmma-vector-sends-own-group", "the wgmma attention epilogue's exchange sends the sender's vector's "
     "group", "attention.habu", "ATTENTION-GQA", SHAPE, vector_sends_own_group, PINS),
    ("attention-wgmma-vector-column-without-lane-group", "the wgmma attention epilogue's vectors forget the lane "
     "group's column offset", "attention.habu", "ATTENTION-GQA", SHAPE, vector_column_without_lane_group, PINS),
    ("attention-wgmma-split-max-unscaled", "a wgmma decode split keeps its raw running max as the partial m",
     "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, split_max_unscaled, DECODE_PINS),
    ("attention-wgmma-split-guard-any-tile", "a wgmma decode split runs its first S wherever the sequence has a "
     "tile", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, split_guard_any_tile, DECODE_PINS),
    ("attention-wgmma-split-from-tile-zero", "every wgmma decode split starts at KV tile 0", "decode_attention.habu",
     "DECODE-ATTENTION", DECODE_SHAPE, split_from_tile_zero, DECODE_PINS),
)
