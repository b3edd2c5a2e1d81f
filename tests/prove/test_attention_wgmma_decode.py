"""Split-KV on the wgmma attention loop (issue 22's decode with K and V by TMA): block x is split
`block_split(x)` of its (query tile, batch element); its consumer warpgroups write the split's partial (O
unnormalised, m and l) and the query tile's last split combines among them (a named barrier, the weights in the
words below the barriers). Proven like the mma.sync split: the `attention-splits` rule and the check over
Z_q × GF(p) with the splits' workspaces poisoned."""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.lower import lower_plan
from habu.lower.attention_wgmma import AttentionWgmmaLowering
from habu.paths.emit import emit_plan
from habu.prove.rules import failures, obligations
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

T = TARGETS["sm_90a"]
SHAPE = {"B": 3, "G": 2, "R": 2, "J": 300, "L": 301, "E": 64, "D": 64}
PINS = {"family": "attention", "main_loop": "wgmma", "bm": "64", "bn": "64", "stages": "2", "kv_split": "128",
        "kv_warps": "1"}


@pytest.fixture(scope="module")
def decode():
    return load_program(ROOT / "examples" / "decode_attention.habu").models["DECODE-ATTENTION"].with_sizes(SHAPE)


def test_the_wgmma_split_decode_is_proven_and_its_consumers_combine(decode):
    plan = default_plan(decode, T, SHAPE, PINS)
    (lw,) = lower_plan(decode, plan)
    assert isinstance(lw, AttentionWgmmaLowering) and lw.kernel.kv_split == 128 and int(lw.splits(SHAPE)) == 3
    assert not failures(obligations(decode, plan, SHAPE))
    cert = verify_plan(decode, plan, SHAPE, trials=1)
    assert cert.passed, cert.failure
    kernel = emit_plan(decode, plan, T).kernels[0]
    assert kernel.zero == ("$O.n",) and {w[0] for w in kernel.workspace} == {"$O.o", "$O.m", "$O.l", "$O.n"}
    src = kernel.source
    assert "const int split = (int)(((long long)blockIdx.x / 6));" in src
    assert "for (long long kt = (split * 2); kt < tiles; ++kt)" in src  # the producer starts at its split
    assert "habu::last_block_done_among(" in src and "habu::named_barrier_sync(3, 128);" in src
    assert "= m[h] * scale;" in src  # the raw scores' max, scaled: the combine's exponents are the scaled scores'
    assert "__syncthreads" not in src.split("this split's partial")[1]  # the producer warpgroup has left


def test_a_partial_max_left_unscaled_is_refused_by_the_field_check(decode, monkeypatch):
    """The kernel keeps the raw scores' running max (the scale folded into the exponent); a split that stored it
    unscaled would weigh the splits by exp(m_s − M) of raw scores: the factors exp(−m_s·c) no longer cancel.
    A trial whose checked sequences all end inside split 0 combines one non-empty partial, and then any weight
    gives the same result: the random lengths, not the field, decide whether a trial can see it (regression
    below)."""
    plan = default_plan(decode, T, SHAPE, PINS)
    monkeypatch.setattr(AttentionWgmmaLowering, "partial_max_scaled", lambda self, sizes: False)
    cert = verify_plan(decode, plan, SHAPE, trials=2, seeds=[1, 2])
    assert not cert.passed and "differs" in cert.failure


def test_a_split_that_starts_at_tile_zero_is_refused(decode, monkeypatch):
    """Every split reading from KV tile 0 (the unsplit kernel's first tile) counts the first keys several times."""
    plan = default_plan(decode, T, SHAPE, PINS)
    monkeypatch.setattr(AttentionWgmmaLowering, "first_tile", lambda self, split=0: 0)
    assert any(f.detail == "a KV tile is in no split, or in two" for f in failures(obligations(decode, plan, SHAPE)))
    cert = verify_plan(decode, plan, SHAPE, trials=2, seeds=[1, 2])
    assert not cert.passed and "differs" in cert.failure


def test_split_kv_with_persistent_blocks_is_refused(decode):
    plan = default_plan(decode, T, SHAPE, {**PINS, "persistent": "1"})
    bad = failures(obligations(decode, plan, SHAPE))
    assert any("not persistent" in f.detail for f in bad), [f.detail for f in bad]


def test_the_search_offers_a_decode_on_the_wgmma_loop_with_splits():
    """A decode (query tiles of 16 rows) is also offered on the wgmma loop: its heads in a 64-row tile, splits of
    0 to 2048 keys, each candidate within the rules at a long cache."""
    from habu.paths.attention import PATH, WGMMA_DECODE_SPLITS
    from habu.plan.patterns import Region
    from habu.plan.plan import AttentionKernel

    long = {**SHAPE, "E": 128, "D": 128, "B": 16, "J": 4096, "L": 4097}
    model = load_program(ROOT / "examples" / "decode_attention.habu").models["DECODE-ATTENTION"].with_sizes(long)
    base = AttentionKernel(nodes=("O",), bm=16, bn=64)
    offered = [k for k in PATH.region_variants(model, Region("general", ("O",)), base, T, long)
               if k.main_loop == "wgmma" and k.bm == 64 and not k.persistent]
    assert {k.kv_split for k in offered} >= set(WGMMA_DECODE_SPLITS)
    for kernel in [k for k in offered if k.kv_split in (0, 1024)]:
        plan = default_plan(model, T, long, {"family": "attention", "main_loop": "wgmma", "bm": "64",
                                             "bn": str(kernel.bn), "stages": str(kernel.stages),
                                             "kv_split": str(kernel.kv_split), "kv_warps": "1"})
        assert not failures(obligations(model, plan, long)), kernel


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_a_combine_mutant_survived_trials_whose_lengths_fell_in_the_first_split(decode, monkeypatch):
    """With uniform lengths and only the first and last sequences checked, the unscaled-max mutant passed 2 of 7
    single trials (seeds 3 and 7: lengths 33 and 7 of 300 both inside the first of three splits) while the
    certificate claimed a 1e-8 bound. Now half of a length tensor's values are the whole sequence
    (`KindProof.length_ranges`) and every batch element of a small witness runs (`LENGTH_BATCH`): each of the
    seven single trials refuses it."""
    from habu.prove.verify import virtual_inputs
    from habu.spec.field_exp import ExpField

    lens = virtual_inputs(decode, SHAPE, ExpField(seed=7), 7, frozenset({"L"}))["LEN"].materialize()
    assert (lens == SHAPE["L"] - 1).any()
    plan = default_plan(decode, T, SHAPE, PINS)
    monkeypatch.setattr(AttentionWgmmaLowering, "partial_max_scaled", lambda self, sizes: False)
    for seed in range(1, 8):
        assert not verify_plan(decode, plan, SHAPE, trials=1, seeds=[seed]).passed, seed


def test_regression_a_split_past_a_short_sequence_waits_for_a_tile_never_loaded(decode, monkeypatch):
    """The emitter guarded the first S and the last P·V with `tiles > 0` (the unsplit kernel's test): a split whose
    first tile lies past its sequence's last (length 87 of 300: split 1 starts at tile 2 of 2) had its consumers
    wait on a stage the producer never filled — the golden GPU test hung (H200, 2026-12-03) while the
    interpreter, looping `kt < tiles` from the split's first tile, passed. The guard is the lowering's `visits`,
    which the interpreter runs too: the old guard now deadlocks in the check."""
    plan = default_plan(decode, T, SHAPE, PINS)
    src = emit_plan(decode, plan, T).kernels[0].source
    assert src.count("if (((split * 2) < tiles)) {") == 2 and "tiles > 0" not in src
    monkeypatch.setattr(AttentionWgmmaLowering, "visits", lambda self, first, tiles: tiles > 0)
    cert = verify_plan(decode, plan, SHAPE, trials=1, seeds=[1])
    assert not cert.passed and "deadlock" in cert.failure


def test_a_decode_that_fills_the_gpu_with_long_splits_defaults_to_the_wgmma_loop():
    """`wgmma_decode_split` (H200, 2026-12-03: 0.94-1.00× cuDNN SDPA where the mma.sync decode ran 0.81-0.86×):
    unsplit where the query tiles nearly fill the 132 SMs, else the fewest splits of 1024-8192 keys that fill them
    (8192 since session 56: 32 query tiles of 32768 keys in one wave, 0.99× SDPA against 0.97× in two);
    None (the mma.sync decode) where even 1024-key splits leave the GPU idle (batch 1, short caches)."""
    from habu.paths.attention import wgmma_decode_split
    from habu.plan.plan import AttentionKernel

    assert [wgmma_decode_split(b, k, 132) for b, k in ((128, 4096), (128, 32768), (32, 4096), (32, 32768),
                                                      (64, 4096), (2, 32768), (2, 4096), (8, 1000))] == \
        [0, 0, 1024, 8192, 2048, None, None, None]
    # no 512-key splits on the wgmma loop since session 55: where 1024-key splits do not fill the GPU, the wide
    # mma.sync block takes it (`decode_split_one_wave`: 8 sequences × 2 KV heads of 4096 keys 1.01× SDPA against the
    # wgmma loop's 512-key splits 0.92×, H100)
    assert [wgmma_decode_split(b, k, 132) for b, k in ((16, 4096), (8, 4096), (2, 32768), (8, 32768))] == \
        [None, None, None, 2048]
    model = load_program(ROOT / "examples" / "decode_attention.habu").models["DECODE-ATTENTION"]
    # the mma.sync decode's 128-key tiles over 8 warps, 3 stages, where its splits run in one wave (session 55); the
    # wgmma loop where they cannot (32 query tiles of 32768 keys) or where the query tiles fill the GPU
    for batch, keys, want in ((16, 4096, ("mma.sync", 16, 1024, 128, 3)), (16, 32768, ("wgmma", 64, 8192, 128, 3)),
                              (2, 32768, ("mma.sync", 16, 1024, 128, 3)), (4, 32768, ("mma.sync", 16, 2048, 128, 3)),
                              (8, 4096, ("mma.sync", 16, 512, 128, 3)), (4, 4096, ("mma.sync", 16, 256, 128, 3)),
                              (64, 32768, ("wgmma", 64, 0, 128, 3)), (1, 4096, ("mma.sync", 16, 256, 128, 3)),
                              (1, 32768, ("mma.sync", 16, 512, 128, 3))):
        sizes = {"B": batch, "J": keys, "L": keys + 1}
        (kernel,) = default_plan(model.with_sizes(sizes), T, sizes).kernels
        assert isinstance(kernel, AttentionKernel)
        got = (kernel.main_loop, kernel.bm, kernel.kv_split, kernel.bn, kernel.stages)
        assert got == want, (batch, keys, kernel)


def test_regression_a_pin_of_the_mma_sync_decodes_tile_brings_its_loop():
    """With the wgmma loop a decode's default, `--pin bm=16` (the mma.sync decode's tile, pinned in earlier
    sessions' commands and in tests/gpu) was applied to the wgmma kernel and refused (`bm = 16: the wgmma main
    loop takes 64 or 128 query rows`; found by the GPU tests, 2026-12-03). The wgmma decode is now the default's
    pins (`decode_pins`), which a pin only the mma.sync loop takes (bm 16/32, kv_warps > 1, main_loop=mma.sync)
    replaces by the mma.sync decode's default."""
    from habu.plan.plan import AttentionKernel

    model = load_program(ROOT / "examples" / "decode_attention.habu").models["DECODE-ATTENTION"]
    sizes = {"B": 16, "J": 32768, "L": 32769}
    m = model.with_sizes(sizes)
    assert default_plan(m, T, sizes).kernels[0].main_loop == "wgmma"
    # the mma.sync decode's default since session 55: 8 warps over 128-key tiles, splits of 4096 keys
    sliced = AttentionKernel(nodes=("O",), bm=16, bn=128, stages=3, kv_warps=8, kv_split=4096, index_width=32)
    for pins in ({"bm": "16"}, {"kv_warps": "4"}, {"main_loop": "mma.sync"}):
        plan = default_plan(m, T, sizes, pins)
        assert plan.kernels == (replace(sliced, kv_warps=int(pins.get("kv_warps", 8))),), pins
        assert not failures(obligations(m, plan, sizes)), pins
    assert default_plan(m, T, sizes, {"kv_split": "2048"}).kernels[0].main_loop == "wgmma"


def test_the_wide_decode_blocks_splits_run_in_one_wave():
    """`decode_split_one_wave` (session 55, H100 against cuDNN SDPA in the same runs: one wave 1.00-1.08×, two waves
    0.72-0.85×): the smallest power-of-two split from 256 keys whose blocks (query tiles × splits) fit the SMs once,
    at most `MAX_SPLITS` splits a tile, at most 4096 keys; 0 where the keys are one split."""
    from habu.paths.attention import MAX_SPLITS, decode_split_one_wave

    cases = {(2, 4096): 256, (8, 4096): 256, (16, 4096): 512, (32, 4096): 1024, (2, 32768): 512, (4, 32768): 1024,
             (8, 32768): 2048, (32, 32768): 4096, (2, 1000): 256, (2, 256): 0, (128, 4096): 0, (1, 65536): 1024}
    assert {key: decode_split_one_wave(*key, 132) for key in cases} == cases
    for (blocks, keys), split in cases.items():
        if split and split < 4096:
            assert blocks * -(-keys // split) <= 132 and -(-keys // split) <= MAX_SPLITS
            assert split == 256 or blocks * -(-keys // (split // 2)) > 132 or -(-keys // (split // 2)) > MAX_SPLITS
