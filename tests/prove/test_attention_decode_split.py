"""Split-KV (flash-decoding, issue 22) as a plan shape of the fused attention family: `--pin kv_split=N`
splits each query tile's KV tiles over blocks that write partials (m, l, unnormalised O) to workspaces, the
last of them combining. Reachable by the pin and the search (not the default until its GPU run has passed);
proven like any plan: the `attention-splits` rule and the check over Z_q × GF(p), whose witness keeps the
lengths' range so that they reach every split. (The combine's and the splits' planted mistakes are in the
mutation suite: `attention-combine-rescale-inverted`, `attention-split-tiles-overlap`,
`attention-partial-slot-ignores-split`.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.bench.mutants_attention import (
    DECODE_PINS,
    DECODE_SHAPE,
    combine_l_of_one_split,
    combine_pairs_of_one_split,
    combine_total_over_a_weight,
    combine_weights_of_one_split,
    partial_slot_ignores_split,
    split_tiles_overlap,
)
from habu.lower import lower_plan
from habu.paths import region_space
from habu.paths.emit import emit_plan
from habu.plan.patterns import Region
from habu.plan.plan import AttentionKernel
from habu.prove.obligation import context, discharge
from habu.prove.rules import failures, obligations
from habu.prove.rules_attention import attention_obligations
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]


@pytest.fixture(scope="module")
def decode():
    return load_program(ROOT / "examples" / "decode_attention.habu").models["DECODE-ATTENTION"].with_sizes(DECODE_SHAPE)


def test_split_kv_is_pinned_searched_and_the_fused_decodes_default_on_a_long_cache(decode):
    """A decode's default (unpinned, and under `--pin family=attention`) is the fused kernel, its KV tiles
    sliced over 4 warps, 3 K/V buffers, split over its keys where its query tiles leave the GPU idle (its
    golden GPU runs passed and it ran 1.8x the one-warp split and 16x the unfused plan, session 31); 100 keys
    are one split of 128: not split. From 256 keys its tiles are 128 keys over 8 warps, its splits one wave
    (session 55). A pinned KV tile brings its warps (16 keys each); the one-warp kernel is
    `kv_warps=1`."""
    sliced = dict(nodes=("O",), bm=16, bn=64, stages=3, kv_warps=4)
    assert default_plan(decode, T, DECODE_SHAPE).kernels == (AttentionKernel(**sliced),)
    long = {**DECODE_SHAPE, "B": 1, "J": 4096, "L": 4097}
    wide = dict(nodes=("O",), bm=16, bn=128, stages=3, kv_warps=8)  # from 256 keys (session 55)
    for pins in ({}, {"family": "attention"}):
        assert default_plan(decode.with_sizes(long), T, long, pins).kernels == (
            AttentionKernel(**wide, kv_split=256),), pins
    assert default_plan(decode.with_sizes(long), T, long, {"family": "attention", "kv_split": "0"}).kernels[0] \
        .kv_split == 0
    assert default_plan(decode.with_sizes(long), T, long, {"bn": "32"}).kernels[0].kv_warps == 2
    assert not any(isinstance(k, AttentionKernel) for k in default_plan(decode.with_sizes(long), T, long,
                                                                        {"rewrite": "attention:O"}).kernels)
    plan = default_plan(decode, T, DECODE_SHAPE, DECODE_PINS)
    assert plan.kernels == (AttentionKernel(nodes=("O",), bm=16, bn=32, kv_split=32),)
    assert "kv_split" in plan.to_json()["kernels"][0] and "kv_split" not in \
        default_plan(decode, T, DECODE_SHAPE).to_json()["kernels"][0]
    splits = {k.kv_split for k in region_space(decode, Region("general", ("O",)), T, DECODE_SHAPE)
              if isinstance(k, AttentionKernel)}
    assert {0, 64, 128, 256, 512} <= splits


def test_split_kv_decode_is_proven_and_prints_the_partials_and_the_combine(decode):
    plan = default_plan(decode, T, DECODE_SHAPE, DECODE_PINS)
    assert not failures(obligations(decode, plan, DECODE_SHAPE))
    cert = verify_plan(decode, plan, DECODE_SHAPE, trials=1)
    assert cert.passed, cert.failure
    emitted = emit_plan(decode, plan, T)
    kernel = emitted.kernels[0]
    assert kernel.zero == ("$O.n",) and {w[0] for w in kernel.workspace} == {"$O.o", "$O.m", "$O.l", "$O.n"}
    assert dict((w[0], w[2]) for w in kernel.workspace)["$O.o"] == ("J/32", "B", "G", "R", "D")
    src = kernel.source
    assert "const int split = (int)(((long long)blockIdx.x / 8));" in src
    assert "habu::last_block_done(" in src and "habu::exp2_fast((wts[((s * 16) + t)] - shift));" in src
    assert "acc += wts[((s * 16) + t)] * __ldcg(" in src  # the splits' weights in shared memory, O from L2
    # each split's l read with its m (one pass over the L2), the weights' sum from shared memory
    pairs = src[src.index("each split's m and l of each row"):src.index("each row: M")]
    assert pairs.count("__ldcg(") == 2 and "__ldcg(" not in src[src.index("each row: M"):src.index("each element:")]


def test_the_splits_rule_refuses_overlapping_splits_and_shared_slots(decode):
    plan = default_plan(decode, T, DECODE_SHAPE, DECODE_PINS)
    ctx = context(decode, plan, DECODE_SHAPE)
    lw = lower_plan(decode, plan)[0]
    good = [discharge(o, ctx) for o in attention_obligations("k0", lw, ctx) if o.rule.name == "attention-splits"]
    assert len(good) >= 8 and not failures(good)
    for planted in (split_tiles_overlap, partial_slot_ignores_split, combine_weights_of_one_split,
                    combine_total_over_a_weight, combine_pairs_of_one_split, combine_l_of_one_split):
        bad = [discharge(o, ctx) for o in attention_obligations("k0", planted(lw), ctx)
               if o.rule.name == "attention-splits"]
        assert failures(bad), planted.__name__


def test_the_combines_first_pairs_are_the_first_rows_every_split(decode):
    """Pairs split-minor (session 42): a decode's rows (its query heads, the tile's first rows) are read by the
    first threads in one pass; row-minor pairs left 2 of every 16 threads reading, one split after another. The
    split loops over a static split count are unrolled whole (every split's load in flight)."""
    plan = default_plan(decode, T, DECODE_SHAPE, DECODE_PINS)
    lw = lower_plan(decode, plan)[0]
    n = lw.splits(DECODE_SHAPE)
    assert lw.combine_in_smem(DECODE_SHAPE) and n > 1
    assert [lw.combine_pair(p, DECODE_SHAPE) for p in range(2 * n)] == \
        [(s, 0) for s in range(n)] + [(s, 1) for s in range(n)]
    src = emit_plan(decode, plan, T).kernels[0].source
    assert "#pragma unroll 32" not in src[src.index("combine them"):]


def test_a_pair_map_one_row_off_changes_the_printed_combine_and_fails_the_field_check(decode):
    """The combine's pair map is printed from the lowering (`combine_pair`) and run by the field check: planted one
    row off, the printed CUDA changes, the first row's weights are never read (the check fails) and the splits rule
    refuses it."""
    from habu.bench.mutants_attention import _planted
    from habu.emit_cuda.emit_attention import emit_attention
    from habu.lower.access import floordiv

    plan = default_plan(decode, T, DECODE_SHAPE, DECODE_PINS)
    lw = lower_plan(decode, plan)[0]
    bad = _planted(lw, "combine_pair", lambda self, p, sizes: (p % self.splits(sizes), floordiv(p, self.splits(sizes)) + 1))
    assert emit_attention("k", decode, bad, dict(DECODE_SHAPE)).source != \
        emit_attention("k", decode, lw, dict(DECODE_SHAPE)).source
    assert verify_plan(decode, plan, DECODE_SHAPE, trials=1, lowerings=[lw]).passed
    assert not verify_plan(decode, plan, DECODE_SHAPE, trials=1, lowerings=[bad]).passed
    ctx = context(decode, plan, DECODE_SHAPE)
    assert failures([discharge(o, ctx) for o in attention_obligations("k0", bad, ctx) if o.rule.name == "attention-splits"])


def test_regression_the_witness_keeps_the_lengths_range_of_a_decode(decode):
    """The witness reduced #L (the lengths' range) to a few values: every sequence's length fell in the first
    split, and a combine that rescaled the wrong way survived the check at the witness shape."""
    from habu.prove.witness import witness_sizes

    plan = default_plan(decode, T, DECODE_SHAPE, DECODE_PINS)
    lws = lower_plan(decode, plan)
    sizes = witness_sizes(decode, ["k0"], lws, DECODE_SHAPE)
    assert sizes["L"] > 3 * 32 and sizes["J"] == DECODE_SHAPE["J"]


def test_regression_a_split_block_reads_its_q_fragments_at_its_own_first_tile(decode):
    """The emitter printed `if (kt == 0)` around the Q fragment reads (the unsplit kernel's first tile): a block
    of split s > 0 starts at tile s·split_tiles, never read Q and multiplied garbage (relative error 1.79 and
    NaN on the H200), while the interpreter, which reads Q at the block's `first_tile`, passed."""
    plan = default_plan(decode, T, DECODE_SHAPE, DECODE_PINS)
    src = emit_plan(decode, plan, T).kernels[0].source
    assert "for (int kt = split; kt < tiles; ++kt)" in src and "    if (kt == split) {" in src
    assert "if (kt == 0)" not in src


def test_sliced_decode_is_proven_and_prints_the_slices_and_their_merge(decode):
    """`--pin kv_warps=2`: each 32-key tile's keys 0.. and 16.. go to warps 0 and 1 (their K and V rows, and the
    keys their mask sees), merged in shared memory before the split's partial is kept; without split-KV the
    merged tile is stored. Both proven (rules and the field check); the merge's mistakes are mutants."""
    from habu.bench.mutants_attention import SLICED_PINS

    for pins in (SLICED_PINS, {**SLICED_PINS, "kv_split": "0"}):
        plan = default_plan(decode, T, DECODE_SHAPE, pins)
        (kernel,) = plan.kernels
        assert isinstance(kernel, AttentionKernel) and kernel.kv_warps == 2
        assert not failures(obligations(decode, plan, DECODE_SHAPE))
        cert = verify_plan(decode, plan, DECODE_SHAPE, trials=1)
        assert cert.passed, cert.failure
        src = emit_plan(decode, plan, T).kernels[0].source
        assert "__launch_bounds__(64, 1)" in src and "((warp % 2) * 16)" in src
        assert "float* merge = reinterpret_cast<float*>(smem);" in src
        assert ("habu::last_block_done(" in src) == bool(kernel.kv_split)


def test_three_kv_buffers_are_proven_and_the_kv_loop_rule_refuses_a_short_prefetch(decode):
    """`--pin stages=3` on the mma.sync loop: two tiles in flight while one is multiplied (a prologue of two
    tiles, one commit group a tile, wait<2>). A copy one tile short (kt + 1, already in flight) computes the
    right values, so the field check cannot see it: the kv-loop rule refuses it."""
    from habu.bench.mutants_attention import STAGED_PINS, _planted

    plan = default_plan(decode, T, DECODE_SHAPE, STAGED_PINS)
    ctx = context(decode, plan, DECODE_SHAPE)
    assert not failures(obligations(decode, plan, DECODE_SHAPE))
    assert verify_plan(decode, plan, DECODE_SHAPE, trials=1).passed
    src = emit_plan(decode, plan, T).kernels[0].source
    assert "if (kt + 2 < tiles) load_kv(kt + 2, (int)(((kt + 2) % 3)));" in src and "cp_async_wait<2>();" in src
    short = _planted(lower_plan(decode, plan)[0], "prefetch_tile", lambda self, kt: kt + 1)
    bad = [discharge(o, ctx) for o in attention_obligations("k0", short, ctx) if o.rule.name == "attention-kv-loop"]
    assert failures(bad)


def test_regression_the_sliced_split_writes_its_rows_m_and_l(decode):
    """The merge's row writer was `d == 0`: on the emitter's C expression Python compared the objects and printed
    `if (false)`, so no split of a sliced decode kept its m and l (the combine read garbage), while the
    interpreter, on numpy, wrote them and passed. Now `d < 1`, printed as a condition; a writer that folds to a
    Python bool is an emitter error."""
    from habu.bench.mutants_attention import SLICED_PINS

    src = emit_plan(decode, default_plan(decode, T, DECODE_SHAPE, SLICED_PINS), T).kernels[0].source
    assert "if ((d < 1)) {" in src and "if (false)" not in src


def test_regression_more_kv_warps_than_the_tile_has_k16_steps_is_refused_by_name(decode):
    """`--pin kv_warps=8` on 64-key tiles (H200 bench, session 38): each warp would take 8 keys, under one k16
    step of P·V. The rule's first failure now says so (before: "K's ldmatrix.x4 pairs cover a warp's keys
    (0 = 8): 0 ≠ 8")."""
    plan = default_plan(decode, T, DECODE_SHAPE, {"family": "attention", "kv_warps": "8", "bn": "64"})
    bad = failures(obligations(decode, plan, DECODE_SHAPE))
    assert bad and "kv_warps 8 leaves each warp 8 keys of a 64-key tile" in bad[0].detail, [o.detail for o in bad]
    assert "bn 64 / kv_warps 8 = 8 keys" in bad[0].describe()


@pytest.mark.parametrize("pins", [
    {"kv_split": "64", "stages": "3"},  # a split's prologue: two tiles, the loop over p
    {"kv_split": "32", "stages": "2"},  # one tile ahead (the two-buffer prologue)
    {"kv_split": "0", "stages": "3"},  # the whole cache in one block
], ids=["split-3-buffers", "split-2-buffers", "whole"])
def test_kv_ahead_copies_the_first_tiles_before_the_length_is_read_and_is_proven(decode, pins):
    """`kv_ahead`: the prologue's copies are bounded by the block's tiles within #J, not by the tiles the
    length leaves visible, so they are issued before LEN's read returns (a memory round trip off a decode block's
    start). The witness's lengths leave whole splits masked: those blocks copy tiles they never read, and the
    check still passes."""
    plan = default_plan(decode, T, DECODE_SHAPE, {**DECODE_PINS, **pins, "kv_ahead": "true"})
    assert plan.kernels[0].kv_ahead
    assert not failures(obligations(decode, plan, DECODE_SHAPE))
    cert = verify_plan(decode, plan, DECODE_SHAPE, trials=1)
    assert cert.passed, cert.failure
    src = emit_plan(decode, plan, T).kernels[0].source
    prologue = src[src.index("auto load_kv"):src.index("Q's A fragments")]
    prologue = prologue[prologue.index("};"):]
    assert "tiles" not in prologue.replace("KV tiles", "") and "load_kv(" in prologue
    plain = emit_plan(decode, default_plan(decode, T, DECODE_SHAPE, {**DECODE_PINS, **pins}), T).kernels[0].source
    plain_prologue = plain[plain.index("auto load_kv"):plain.index("Q's A fragments")]
    assert "tiles" in plain_prologue[plain_prologue.index("};"):].replace("KV tiles", "")
    assert not default_plan(decode, T, DECODE_SHAPE).kernels[0].kv_ahead


def test_kv_ahead_is_refused_on_the_wgmma_loop(decode):
    """The wgmma loop's producer reads the key limit before its TMA copies: the field would be a promise it does
    not keep, so the rules refuse it there (and pass it on the mma.sync loop)."""
    plan = default_plan(decode, T, DECODE_SHAPE, DECODE_PINS)
    ahead = replace(plan, kernels=(replace(plan.kernels[0], kv_ahead=True),))
    assert not failures(obligations(decode, ahead, DECODE_SHAPE))
    wgmma = replace(plan, kernels=(replace(plan.kernels[0], kv_ahead=True, main_loop="wgmma"),))
    bad = failures(obligations(decode, wgmma, DECODE_SHAPE))
    assert any("kv_ahead" in o.statement for o in bad), [o.describe() for o in bad]
