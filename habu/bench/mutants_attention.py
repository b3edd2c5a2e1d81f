"""Planted mistakes in the fused attention kernel's lowering (habu/lower/attention.py): the online softmax's
rescale and running-maximum bookkeeping, the causal skip and the lanes of a row's reduction. Each changes
the CUDA the emitter prints (the same methods print it); the finite-field check over Z_q × GF(p) must reject
every one on the CPU. They are entries of the mutation suite (`MUTANTS` in habu/bench/mutants.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from habu.lower.access import cdiv, floordiv, minimum
from habu.lower.attention import AttentionLowering

# examples/attention.habu at a shape where the causal skip matters: 3 query tiles of 32 rows, 4 KV tiles of
# 32 keys, queries at the end of 100 keys (the first query tile sees 62 of them, 2 tiles); head width 16
SHAPE = {"B": 1, "G": 1, "R": 2, "I": 70, "J": 100, "E": 16, "D": 16}
PINS = {"family": "attention", "bm": "32", "bn": "32"}


def _planted(lw: Any, method: str, body: Callable) -> AttentionLowering:
    """The same lowering with one method replaced (a subclass: methods are not fields)."""
    assert isinstance(lw, AttentionLowering)
    cls = type(f"Planted_{method}", (AttentionLowering,), {method: body})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def rescale_inverted(lw: Any) -> AttentionLowering:
    """l and O multiplied by exp(m_new − m_old): earlier tiles grow instead of shrinking."""
    return _planted(lw, "rescale", lambda self, m_old, m_new, ops: ops.sub(m_new, m_old))


def max_not_kept(lw: Any) -> AttentionLowering:
    """The tile's weights use the new maximum, but the running maximum is never updated: the next rescale
    is taken from the stale one."""
    return _planted(lw, "kept_max", lambda self, m_old, m_new: m_old)


def skip_one_tile_too_many(lw: Any) -> AttentionLowering:
    """The causal skip drops one tile too many: the last tile holding visible keys is never visited."""
    visits = AttentionLowering.kv_tiles
    return _planted(lw, "kv_tiles", lambda self, limit, sizes, clamp: visits(self, limit, sizes, clamp) - 1)


def row_max_two_lanes(lw: Any) -> AttentionLowering:
    """The row maximum joins 2 of a row's 4 lanes (shuffle xor 1 only): lanes of one row shift by different
    maxima, and P·V mixes their weights."""
    assert isinstance(lw, AttentionLowering)
    return replace(lw, quad_offsets=(1,))


def p_fragment_swapped(lw: Any) -> AttentionLowering:
    """P's A registers 1 and 2 swapped (rows g + 8 taken for columns + 8): the PTX A layout misread."""
    def p_fragment(self, kk, reg):
        reg = {1: 2, 2: 1}.get(reg, reg)
        group = 2 * kk + reg // 2
        return (group, 2 * (reg % 2)), (group, 2 * (reg % 2) + 1)

    return _planted(lw, "p_fragment", p_fragment)


def next_tile_same_buffer(lw: Any) -> AttentionLowering:
    """Every KV tile staged in buffer 0: the next tile's copies overwrite the tile being multiplied."""
    return _planted(lw, "stage_of", lambda self, kt: kt * 0)


def v_rows_of_one_matrix(lw: Any) -> AttentionLowering:
    """The lanes of matrices 1 and 3 name the rows of matrices 0 and 2 again (keys 8..15 of each step read as
    keys 0..7)."""
    from habu.lower.attention import MMA_K, MMA_N

    return _planted(lw, "v_rows", lambda self, stage, lane, kk, dp:
                    self.v_smem(stage, kk * MMA_K + lane % 8, dp * 2 * MMA_N + floordiv(lane, 16) * MMA_N))


def mask_dropped_one_tile_early(lw: Any) -> AttentionLowering:
    """The tile that straddles the causal diagonal is taken as wholly visible (its mask dropped): the open
    limit read one KV tile too far."""
    limit = AttentionLowering.open_limit
    return _planted(lw, "open_limit", lambda self, qt, sizes, term: limit(self, qt, sizes, term) + self.kernel.bn)


def k_matrices_swapped(lw: Any) -> AttentionLowering:
    """ldmatrix.x4 of K is handed matrix 1 as keys + 8 and matrix 2 as columns + 8 (the roles of the four
    8×8 matrices confused)."""
    from habu.lower.attention import MMA_K, MMA_N

    def k_rows(self, stage, lane, kk, jp):
        m = floordiv(lane, 8)
        return self.k_smem(stage, jp * 2 * MMA_N + (m % 2) * MMA_N + lane % 8, kk * MMA_K + floordiv(m, 2) * 8)

    return _planted(lw, "k_rows", k_rows)


def row_tile_ignores_mi(lw: Any) -> AttentionLowering:
    """With two row tiles a warp, both accumulator sets compute the warp's first row tile: rows written twice,
    the second tile's rows never."""
    return _planted(lw, "row_tile", lambda self, warp, mi: warp * self.kernel.warp_m)


def _planted_count(lw: Any, name: str, planted: Callable[[int], int]) -> AttentionLowering:
    """The same lowering with one of its loop counts (a property) planted wrong."""
    assert isinstance(lw, AttentionLowering)
    base = getattr(AttentionLowering, name)
    cls = type(f"Planted_{name}", (AttentionLowering,), {name: property(lambda self: planted(base.fget(self)))})
    return cls(**{f.name: getattr(lw, f.name) for f in fields(lw)})


def score_groups_one_short(lw: Any) -> AttentionLowering:
    """The loops over S's 8-key accumulator groups stop one group early: the last 8 keys of every KV tile
    are never scaled, masked or weighed (the fragment loops' trip counts)."""
    return _planted_count(lw, "score_groups", lambda n: n - 1)


def copy_one_chunk_short(lw: Any) -> AttentionLowering:
    """Each staged tile's cp.async loop copies one 16-byte chunk too few: the last 8 columns of its last row
    keep whatever the buffer held."""
    copies = AttentionLowering.copy_chunks
    return _planted(lw, "copy_chunks", lambda self, rows, width: copies(self, rows, width) - 1)


def staged_column_shifted(lw: Any) -> AttentionLowering:
    """A staged chunk reads the tensor one column to the right of where it is stored (e + 1 for e)."""
    return _planted(lw, "staged_column", lambda self, col: col + 1)


def register_halves_swapped(lw: Any) -> AttentionLowering:
    """Register q of an 8-column group is taken as row half q % 2 and column q / 2 (the accumulator's
    register decode transposed): scores are masked and shifted by another row's values."""
    return _planted(lw, "register_parts", lambda self, q: (q % self.fragment.pair, floordiv(q, self.fragment.pair)))


def b_registers_swapped(lw: Any) -> AttentionLowering:
    """The two registers of each B fragment taken from ldmatrix.x4 in the wrong order (k rows 8.. first)."""
    return _planted(lw, "b_registers", lambda self, half: (2 * half + 1, 2 * half))


def next_tile_skips_one(lw: Any) -> AttentionLowering:
    """The copy issued during tile kt loads tile kt + 2 (into kt's own buffer): tiles are skipped and the
    tile being multiplied is overwritten."""
    return _planted(lw, "next_tile", lambda self, kt: kt + 2)


# examples/decode_attention.habu split over the KV cache: 4 sequences (lengths drawn up to #J), 2 KV heads of
# 2 query heads, 100 keys in KV tiles of 32, one a split (4 splits, the last ragged); head width 16
DECODE_SHAPE = {"B": 4, "G": 2, "R": 2, "J": 100, "L": 101, "E": 16, "D": 16}
DECODE_PINS = {"family": "attention", "bm": "16", "bn": "32", "kv_split": "32", "kv_warps": "1", "stages": "2"}


def combine_rescale_inverted(lw: Any) -> AttentionLowering:
    """Split-KV's combine multiplies each split's l and O by exp(M − m_s) instead of exp(m_s − M)."""
    return _planted(lw, "combine_exponent", lambda self, m_split, m_all, ops: ops.sub(m_all, m_split))


def split_tiles_overlap(lw: Any) -> AttentionLowering:
    """Each split ends one KV tile late: the first tile of every later split is counted by two splits. (A
    split starting one tile early instead counts every tile twice where the splits are one tile each: the
    weights then scale uniformly, and the result is right.)"""
    return _planted(lw, "end_tile", lambda self, split, tiles: minimum(tiles, (split + 1) * self.split_tiles + 1))


AHEAD_PINS = {**DECODE_PINS, "kv_split": "64", "stages": "3", "kv_ahead": "true"}


def ahead_limit_of_split_zero(lw: Any) -> AttentionLowering:
    """With `kv_ahead`, the prologue's copies stop at split 0's last tile: a later split's first tiles are never
    copied, and its loop multiplies whatever its buffers held."""
    return _planted(lw, "prologue_limit", lambda self, split, tiles, sizes: self.end_tile(
        split * 0, cdiv(sizes[self.key_extent], self.kernel.bn)))


def partial_slot_ignores_split(lw: Any) -> AttentionLowering:
    """Every split keeps its m and l in split 0's slots: the combine reads one split's m and l for all."""
    slot = AttentionLowering.partial_slot
    return _planted(lw, "partial_slot", lambda self, split, flat, row, sizes: slot(self, split * 0, flat, row, sizes))


# the same decode with its KV tiles sliced over 2 warps a block (keys 16.. of each 32-key tile the second warp's),
# their partials merged in shared memory before the split's partial is kept
SLICED_PINS = {**DECODE_PINS, "kv_split": "64", "kv_warps": "2"}


def merge_rescale_inverted(lw: Any) -> AttentionLowering:
    """The merge of a block's key slices multiplies each slice's l and O by exp(M − m_s)."""
    return _planted(lw, "merge_exponent", lambda self, m_slice, m_all, ops: ops.sub(m_all, m_slice))


def merge_one_slice(lw: Any) -> AttentionLowering:
    """The merge reads slice 0's warp for every slice: the other slices' keys are dropped, slice 0 counted twice."""
    merge_warp = AttentionLowering.merge_warp
    return _planted(lw, "merge_warp", lambda self, t, s: merge_warp(self, t, s * 0))


def key_slice_ignores_warp(lw: Any) -> AttentionLowering:
    """Every warp multiplies the first slice of each KV tile (its K rows, V rows and the keys its mask sees)."""
    return _planted(lw, "key_slice", lambda self, warp: warp * 0)


def merge_rows_of_warp_zero(lw: Any) -> AttentionLowering:
    """Each warp stores its partial O where warp 0's goes: the merge reads the last writer's slice for all."""
    merge_o = AttentionLowering.merge_o
    return _planted(lw, "merge_o", lambda self, warp, t, d: merge_o(self, warp * 0, t, d))


# the decode whole (4 KV tiles of 32 keys a block) with 3 K/V buffers: two tiles in flight while one is multiplied
STAGED_PINS = {**DECODE_PINS, "kv_split": "0", "stages": "3"}


def prefetch_one_far(lw: Any) -> AttentionLowering:
    """With 3 buffers the copy issued during tile kt loads tile kt + 3 instead of kt + 2: into tile kt's own
    buffer, before it is multiplied (and tile kt + 2 is never loaded). (One short, kt + 1, loads a tile
    already in flight: the results are right and only the wait is wrong; the kv-loop rule refuses it.)"""
    return _planted(lw, "prefetch_tile", lambda self, kt: kt + self.kv_stages)


def stages_of_two(lw: Any) -> AttentionLowering:
    """Tiles staged in 2 of the 3 buffers (kt % 2): the copy of tile kt + 2 lands in the buffer of tile kt."""
    return _planted(lw, "stage_of", lambda self, kt: kt % 2)


def combine_weights_of_one_split(lw: Any) -> AttentionLowering:
    """The combine keeps every split's weight of a row in one word (split 0's): the last split's weight is
    applied to every split's O."""
    combine_w = AttentionLowering.combine_w
    return _planted(lw, "combine_w", lambda self, s, t: combine_w(self, s * 0, t))


def combine_pairs_of_one_split(lw: Any) -> AttentionLowering:
    """The combine's pairs step rows by the tile's rows instead of the split count: (split, row) pairs repeat and
    the tile's later rows never get their weights. Killed by the splits rule; not by the field check at the decode
    shape, whose only rows (the first) still see every split: the rule, not the trial, holds this map."""
    return _planted(lw, "combine_pair", lambda self, p, sizes: (p % self.splits(sizes), floordiv(p, self.kernel.bm)))


def combine_l_of_one_split(lw: Any) -> AttentionLowering:
    """The split-KV combine keeps every split's l of a row in split 0's word: each row's total sums the last
    split's l under every weight."""
    combine_l = AttentionLowering.combine_l
    return _planted(lw, "combine_l", lambda self, s, t, sizes: combine_l(self, s * 0, t, sizes))


def combine_total_over_a_weight(lw: Any) -> AttentionLowering:
    """The combine keeps a row's total l in the word of its first split's weight (read back as that weight)."""
    return _planted(lw, "combine_total", lambda self, t, sizes: self.combine_w(0, t))


def counter_not_reset(lw: Any) -> AttentionLowering:
    """The combining block leaves its tile's counter at the split count: the runtime zero-fills the counters
    only when it allocates them, so the next launch's count never reaches the split count again."""
    return _planted(lw, "counter_after", lambda self, sizes: self.arrivals(sizes))


def statistics_two_writers(lw: Any) -> AttentionLowering:
    """A training forward's row statistics stored by two lanes of each row's quad: the same element written twice
    (a race between the lanes: the check flags it)."""
    return _planted(lw, "stat_writer", lambda self, lane: lane % 4 < 2)


def statistics_row_half_swapped(lw: Any) -> AttentionLowering:
    """A training forward's row statistics stored at the lane's other row half (rows g and g + 8 swapped)."""
    return _planted(lw, "stat_row", lambda self, rt, lane, h: AttentionLowering.stat_row(self, rt, lane, 1 - h))


def statistics_swapped(lw: Any) -> AttentionLowering:
    """A training forward's row maximum stored into the sum's tensor and the sum into the maximum's."""
    assert isinstance(lw, AttentionLowering) and lw.stats is not None
    return replace(lw, stats=(lw.stats[1], lw.stats[0]))


# the mutation suite's entries (habu/bench/mutants.py's `Mutant` fields: name, the bug, example, model, shape,
# the planted lowering, pins)
MUTANT_ENTRIES: tuple[tuple[Any, ...], ...] = (
    ("attention-rescale-inverted", "the fused attention kernel rescales l and O by exp(m_new − m_old)",
     "attention.habu", "ATTENTION-GQA", SHAPE, rescale_inverted, PINS),
    ("attention-max-not-kept", "the fused attention kernel's weights use the new row maximum but the "
     "running maximum is never updated", "attention.habu", "ATTENTION-GQA", SHAPE, max_not_kept, PINS),
    ("attention-skip-one-tile-too-many", "the causal skip drops the last KV tile that holds visible keys",
     "attention.habu", "ATTENTION-GQA", SHAPE, skip_one_tile_too_many, PINS),
    ("attention-row-max-two-lanes", "the row maximum is shuffled over 2 of a row's 4 lanes",
     "attention.habu", "ATTENTION-GQA", SHAPE, row_max_two_lanes, PINS),
    ("attention-p-fragment-swapped", "P's A fragment packs the accumulators of rows g + 8 where the "
     "instruction takes columns + 8", "attention.habu", "ATTENTION-GQA", SHAPE, p_fragment_swapped,
     PINS),
    ("attention-next-tile-same-buffer", "the next KV tile is copied into the buffer being multiplied",
     "attention.habu", "ATTENTION-GQA", SHAPE, next_tile_same_buffer, PINS),
    ("attention-v-rows-of-one-matrix", "ldmatrix.x4.trans of V is handed the rows of its first 8×8 matrices "
     "twice", "attention.habu", "ATTENTION-GQA", SHAPE, v_rows_of_one_matrix, PINS),
    ("attention-mask-dropped-one-tile-early", "the KV tile straddling the causal diagonal is taken as "
     "wholly visible (no mask)", "attention.habu", "ATTENTION-GQA", SHAPE, mask_dropped_one_tile_early,
     PINS),
    ("attention-k-matrices-swapped", "ldmatrix.x4 of K takes its second and third 8×8 matrices in each "
     "other's place", "attention.habu", "ATTENTION-GQA", SHAPE, k_matrices_swapped, PINS),
    ("attention-row-tile-ignores-mi", "a warp of two 16-row tiles computes its first tile twice",
     "attention.habu", "ATTENTION-GQA", SHAPE, row_tile_ignores_mi, {**PINS, "warp_m": "2"}),
    ("attention-score-groups-one-short", "the fused attention kernel's loops over S's 8-key accumulator "
     "groups stop one group early", "attention.habu", "ATTENTION-GQA", SHAPE, score_groups_one_short,
     PINS),
    ("attention-copy-one-chunk-short", "each staged Q, K and V tile's cp.async loop copies one 16-byte chunk "
     "too few", "attention.habu", "ATTENTION-GQA", SHAPE, copy_one_chunk_short, PINS),
    ("attention-staged-column-shifted", "a staged chunk reads its tensor one column to the right",
     "attention.habu", "ATTENTION-GQA", SHAPE, staged_column_shifted, PINS),
    ("attention-register-halves-swapped", "an accumulator register's row half and column within the lane's "
     "pair are decoded the wrong way round", "attention.habu", "ATTENTION-GQA", SHAPE,
     register_halves_swapped, PINS),
    ("attention-b-registers-swapped", "the two registers of each K and V B fragment are taken from "
     "ldmatrix.x4 in the wrong order", "attention.habu", "ATTENTION-GQA", SHAPE, b_registers_swapped,
     PINS),
    ("attention-next-tile-skips-one", "the copy issued while KV tile kt is multiplied loads tile kt + 2",
     "attention.habu", "ATTENTION-GQA", SHAPE, next_tile_skips_one, PINS),
    ("attention-combine-rescale-inverted", "split-KV's combine multiplies each split's l and O by "
     "exp(M − m_s)", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, combine_rescale_inverted,
     DECODE_PINS),
    ("attention-split-tiles-overlap", "each KV split ends one tile late (the next split's first tile in two "
     "splits)", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, split_tiles_overlap,
     DECODE_PINS),
    ("attention-merge-rescale-inverted", "the merge of a decode block's key slices multiplies each slice's l "
     "and O by exp(M − m_s)", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, merge_rescale_inverted,
     SLICED_PINS),
    ("attention-merge-one-slice", "the merge of a decode block's key slices reads slice 0 for every slice",
     "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, merge_one_slice, SLICED_PINS),
    ("attention-key-slice-ignores-warp", "every warp of a decode block multiplies the first key slice of each "
     "KV tile", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, key_slice_ignores_warp, SLICED_PINS),
    ("attention-merge-o-of-warp-zero", "every warp of a decode block stores its partial O in warp 0's rows of "
     "the merge area", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, merge_rows_of_warp_zero,
     SLICED_PINS),
    ("attention-prefetch-one-far", "with 3 K/V buffers the copy issued during KV tile kt loads tile kt + 3 "
     "instead of kt + 2", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, prefetch_one_far, STAGED_PINS),
    ("attention-stages-of-two", "with 3 K/V buffers the tiles are staged in 2 (kt % 2)", "decode_attention.habu",
     "DECODE-ATTENTION", DECODE_SHAPE, stages_of_two, STAGED_PINS),
    ("attention-combine-weights-of-one-split", "the split-KV combine keeps every split's weight of a row in one "
     "shared-memory word", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, combine_weights_of_one_split,
     DECODE_PINS),
    ("attention-combine-l-of-one-split", "the split-KV combine keeps every split's l of a row in one "
     "shared-memory word", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, combine_l_of_one_split,
     DECODE_PINS),
    ("attention-combine-total-over-a-weight", "the split-KV combine keeps a row's total l in its first split's "
     "weight word", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, combine_total_over_a_weight,
     DECODE_PINS),
    ("attention-counter-not-reset", "the split-KV combine leaves its query tile's counter at the split count "
     "(counters are zero-filled once)", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE,
     counter_not_reset, DECODE_PINS),
    ("attention-kv-ahead-limit-of-split-zero", "with the K/V copies ahead of the key limit (kv_ahead), every "
     "split's prologue stops at split 0's last tile", "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE,
     ahead_limit_of_split_zero, AHEAD_PINS),
    ("attention-partial-slot-ignores-split", "every KV split keeps its m and l in split 0's slots",
     "decode_attention.habu", "DECODE-ATTENTION", DECODE_SHAPE, partial_slot_ignores_split,
     DECODE_PINS),
    # the fused kernel of a training forward (`fused:O`), storing the row maximum R1 and sum R2 beside O
    ("attention-statistics-two-writers", "a training forward's row statistics stored by two lanes of each row's "
     "quad", "attention.habu", "ATTENTION-GQA:forward", SHAPE, statistics_two_writers, PINS),
    ("attention-statistics-swapped", "a training forward's row maximum and sum stored into each other's tensor",
     "attention.habu", "ATTENTION-GQA:forward", SHAPE, statistics_swapped, PINS),
    ("attention-statistics-row-half-swapped", "a training forward's row statistics stored at the lane's other row "
     "half", "attention.habu", "ATTENTION-GQA:forward", SHAPE, statistics_row_half_swapped, PINS),
)
