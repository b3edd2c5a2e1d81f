"""The fused attention kernel's wgmma main loop (issue 22, FA3-style; `--pin family=attention --pin
main_loop=wgmma`, habu/lower/attention_wgmma.py): reachable by the pin and the search, not the default; proven
over Z_q × GF(p) with two consumer warpgroups at head width 128; built for sm_90a by NVRTC on this machine with
no spill; the rules refuse what the loop cannot run and a ring whose stages wrap late. (The planted mistakes are
in the mutation suite: tests/bench/test_mutants.py, `attention-wgmma-*`.)"""

from __future__ import annotations

from dataclasses import replace

import pytest

from habu.bench.mutants_attention_wgmma import PINS, SHAPE
from habu.errors import UsageError
from habu.lower import lower_plan
from habu.lower.attention_wgmma import AttentionWgmmaLowering
from habu.paths import region_space
from habu.paths.emit import emit_plan
from habu.plan.patterns import Region
from habu.plan.plan import AttentionKernel
from habu.prove.rules import failures, obligations
from habu.prove.rules_attention_wgmma import ring_problem
from habu.prove.verify import verify_plan
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

EX = ROOT / "examples"
T = TARGETS["sm_90a"]
WIDE = {"B": 1, "G": 1, "R": 2, "I": 70, "J": 100, "E": 128, "D": 128}


@pytest.fixture(scope="module")
def prefill():
    return load_program(EX / "attention.habu").models["ATTENTION-GQA"]


def test_the_pin_takes_the_wgmma_loop_and_the_family_default_stays_mma_sync(prefill):
    model = prefill.with_sizes(WIDE)
    (fused,) = default_plan(model, T, WIDE, {"family": "attention"}).kernels
    assert isinstance(fused, AttentionKernel) and fused.main_loop == "mma.sync"
    (wg,) = default_plan(model, T, WIDE, {"family": "attention", "main_loop": "wgmma"}).kernels
    assert isinstance(wg, AttentionKernel) and (wg.main_loop, wg.bm, wg.bn, wg.stages) == ("wgmma", 128, 128, 3)
    (lw,) = lower_plan(model, default_plan(model, T, WIDE, {"family": "attention", "main_loop": "wgmma"}))
    assert isinstance(lw, AttentionWgmmaLowering) and lw.consumers == 2 and lw.threads == 384


@pytest.mark.parametrize(("width", "tile"), [(64, (128, 3)), (256, (64, 2))])
def test_the_pin_fits_its_keys_and_stages_to_shared_memory(prefill, width, tile):
    """3 stages of 128 keys where they fit (head width 64 and 128); at 256 two stages of 64 keys (of 128 they would
    need 320 KB): the rules pass (the shared memory within the block's 227 KB)."""
    sizes = {**WIDE, "E": width, "D": width}
    model = prefill.with_sizes(sizes)
    plan = default_plan(model, T, sizes, {"family": "attention", "main_loop": "wgmma"})
    (wg,) = plan.kernels
    assert isinstance(wg, AttentionKernel) and (wg.bn, wg.stages) == tile
    assert not failures(obligations(model, plan, sizes))


def test_the_search_offers_the_wgmma_loop(prefill):
    model = prefill.with_sizes(WIDE)
    (node,) = [e.target for e in model.nodes]
    space = list(region_space(model, Region("general", (node,)), T, WIDE))
    assert any(isinstance(k, AttentionKernel) and k.main_loop == "wgmma" for k in space)


def test_the_wgmma_plan_at_head_width_128_is_proven_and_builds_without_spills(prefill, tmp_path):
    """Two consumer warpgroups (bm 128) taking turns (ping-pong), KV tiles of 64 keys in 3 stages: the rules, one
    trial over Z_q × GF(p), and NVRTC's sm_90a cubin within the registers setmaxnreg gives the consumers, no
    spill."""
    from habu.emit_cuda.runtime import CompiledModel

    model = prefill.with_sizes(WIDE)
    plan = default_plan(model, T, WIDE, {"family": "attention", "main_loop": "wgmma", "bn": "64", "stages": "3",
                                         "pingpong": "1"})
    assert not failures(obligations(model, plan, WIDE))
    cert = verify_plan(model, plan, WIDE, trials=1, seeds=[5])
    assert cert.passed, cert.failure
    ((cubin,),) = CompiledModel(model, emit_plan(model, plan, T), cache_dir=tmp_path).compile("sm_90a")
    assert cubin.cubin.startswith(b"\x7fELF") and not cubin.resources.spills, cubin.resources.describe()
    # regression: a wgmma issued under a condition (the next tile's S) made ptxas serialise every wgmma (C7515)
    assert "C7515" not in cubin.log and "serialized" not in cubin.log, cubin.log
    assert "habu::turn_wait" in emit_plan(model, plan, T).kernels[0].source


def test_a_head_width_not_in_64s_is_a_usage_error_of_the_pin(prefill):
    sizes = {**SHAPE, "E": 16, "D": 16}
    with pytest.raises(UsageError, match="main_loop=wgmma"):
        default_plan(prefill.with_sizes(sizes), T, sizes, {"family": "attention", "main_loop": "wgmma"})


@pytest.mark.parametrize(("pins", "why"), [({"bm": "32"}, "bm = 32"), ({"pingpong": "1"}, "ping-pong"),
                                           ({"kv_split": "128", "persistent": "1"}, "split-KV")])
def test_the_rules_refuse_what_the_loop_cannot_run(prefill, pins, why):
    """A query tile of 32 rows (wgmma's m64), ping-pong with one consumer warpgroup (bm 64), and a KV split
    with persistent blocks (a split block runs one work tile; the loop's split: test_attention_wgmma_decode.py)."""
    model = prefill.with_sizes(SHAPE)
    plan = default_plan(model, T, SHAPE, {**PINS, **pins})
    bad = failures(obligations(model, plan, SHAPE))
    assert any(o.rule.name == "supported-path" and why in o.detail for o in bad), bad


def test_the_ring_rule_rejects_stages_that_wrap_late(prefill):
    model = prefill.with_sizes(SHAPE)
    (lw,) = lower_plan(model, default_plan(model, T, SHAPE, PINS))
    assert isinstance(lw, AttentionWgmmaLowering) and lw.ring is not None
    assert ring_problem(lw.ring) is None
    assert ring_problem(replace(lw.ring, wrap=lw.ring.stages + 1)) is not None


def test_the_scale_is_folded_into_the_exponent_only_where_it_is_a_positive_constant(prefill):
    """FA3's one FFMA a score: the max of the raw scores and P = 2^(s·c − m·c), where c = rsqrt(#E)·log2 e > 0;
    a negative c would make the raw max the scaled min (the exponents overflow), so it keeps the multiply."""
    from fractions import Fraction

    from habu.lower.attention_wgmma import constant_value
    from habu.spec.ir import Const, Op, Size

    model = prefill.with_sizes(WIDE)
    plan = default_plan(model, T, WIDE, {"family": "attention", "main_loop": "wgmma"})
    (lw,) = lower_plan(model, plan)
    assert lw.scale is not None and constant_value(lw.scale, WIDE) == pytest.approx(128 ** -0.5)
    assert lw.scale_in_exponent(WIDE)
    src = emit_plan(model, plan, T).kernels[0].source
    assert "fmaf(s[" in src and "*= scale" not in src
    negative = Op("mul", (Const(Fraction(-1)), Size("E")))
    assert constant_value(negative, WIDE) == -128.0
    unfolded = replace(lw, scale=negative)
    assert not unfolded.scale_in_exponent(WIDE)
    from habu.emit_cuda.emit_attention_wgmma import emit_attention_wgmma

    kept = emit_attention_wgmma("k", model, unfolded, dict(plan.shape)).source
    assert "*= scale" in kept and "fmaf(s[" not in kept


@pytest.mark.parametrize(("rows", "target", "fused"), [(1024, "sm_90a", True), (128, "sm_90a", True), (100, "sm_90a", False),
                                                       (4096, "sm_80", False)])
def test_the_default_of_a_long_prefill_on_sm_90a_is_the_wgmma_kernel(prefill, rows, target, fused):
    """No pin: from `WGMMA_PREFILL_ROWS` queries on a target with wgmma and TMA the plan is the fused kernel on the
    wgmma loop (3 stages at head width 128); shorter prefills and sm_80 keep the unfused plan (the rewrite)."""
    sizes = {**WIDE, "I": rows, "J": rows}
    model = prefill.with_sizes(sizes)
    plan = default_plan(model, TARGETS[target], sizes)
    kinds = [(k.kind, getattr(k, "main_loop", None), getattr(k, "stages", None)) for k in plan.kernels]
    if fused:
        assert kinds == [("attention", "wgmma", 3)] and not plan.rewrites and plan.kernels[0].pingpong
    else:
        assert all(k[0] != "attention" for k in kinds) and "attention:O" in plan.rewrites


def test_the_head_major_grid_is_proven(prefill):
    """`head_major`: a batch element's query tiles one after another (block x: tile #tiles − 1 − x mod #tiles of
    batch element x / #tiles); the field check runs the blocks of its sampled tiles and elements."""
    from habu.bench.mutants_attention_wgmma import HEAD_MAJOR_PINS
    from habu.bench.mutants_attention_wgmma import SHAPE as SMALL

    model = prefill.with_sizes(SMALL)
    plan = default_plan(model, T, SMALL, HEAD_MAJOR_PINS)
    (lw,) = lower_plan(model, plan)
    assert lw.kernel.head_major and [(lw.query_tile(x, SMALL), lw.batch_flat(x, SMALL)) for x in range(4)] == \
        [(1, 0), (0, 0), (1, 1), (0, 1)]
    assert not failures(obligations(model, plan, SMALL))
    cert = verify_plan(model, plan, SMALL, trials=1, seeds=[2])
    assert cert.passed, cert.failure


def test_regression_a_pinned_bm_64_on_the_prefill_default_drops_its_ping_pong(prefill):
    """The default's ping-pong (two consumer warpgroups) with `--pin bm=64` (one) was a plan the rules refuse."""
    sizes = {**WIDE, "I": 1024, "J": 1024}
    model = prefill.with_sizes(sizes)
    plan = default_plan(model, T, sizes, {"bm": "64"})
    (k,) = plan.kernels
    assert isinstance(k, AttentionKernel) and (k.main_loop, k.bm, k.pingpong) == ("wgmma", 64, False)
    assert not failures(obligations(model, plan, sizes))


def test_late_wait_prints_the_block_end_before_the_p_v_wait_and_the_default_does_not(prefill):
    sizes = {**WIDE, "I": 1024, "J": 1024}
    model = prefill.with_sizes(sizes)
    default = emit_plan(model, default_plan(model, T, sizes), T).kernels[0].source
    late = emit_plan(model, default_plan(model, T, sizes, {"late_wait": "1"}), T).kernels[0].source
    assert "habu::end_block(" not in default
    assert late.count("habu::end_block(l[0]);") == 1 and late.index("habu::end_block(") < late.index("// P(kt)·V(kt)")


@pytest.mark.parametrize(("out_dtype", "words"), [("f32", 2), ("bf16", 4)])
def test_the_epilogue_stores_o_in_16_byte_vectors_proven_and_built(prefill, tmp_path, out_dtype, words):
    """The lanes of an accumulator row trade column pairs (habu/lower/quad_vectors.py), then store 16 bytes each:
    the default (session 36: the 4 × 16 × 1024 prefill's epilogue took 21% of its stall samples in 2-byte stores,
    83.5 → 65.1 µs); one trial over Z_q × GF(p), NVRTC's cubin without spills, O's base address 16-byte aligned in
    the contract; `store_vectors=false` keeps one element a store."""
    from habu.emit_cuda.checks import contract_of
    from habu.emit_cuda.runtime import CompiledModel
    from habu.spec.parser import parse_text

    text = (EX / "attention.habu").read_text().replace("f32  TENSOR: O", f"{out_dtype} TENSOR: O")
    model = parse_text(text, str(EX / "attention.habu")).models["ATTENTION-GQA"].with_sizes(WIDE)
    pins = {"family": "attention", "main_loop": "wgmma"}
    plan = default_plan(model, T, WIDE, pins)
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, AttentionWgmmaLowering) and lw.out_vectors is not None and lw.out_vectors.words == words
    assert verify_plan(model, plan, WIDE, trials=1, seeds=[3]).passed
    emitted = emit_plan(model, plan, T)
    source = emitted.kernels[0].source
    assert "habu::store_words<4>" in source and "__shfl_xor_sync" in source
    assert {t.name: t.align for t in contract_of(model, emitted).tensors}["O"] == 16
    ((cubin,),) = CompiledModel(model, emitted, cache_dir=tmp_path).compile("sm_90a")
    assert not cubin.resources.spills, cubin.resources.describe()
    scalar = default_plan(model, T, WIDE, {**pins, "store_vectors": "false"})
    (lw0,) = lower_plan(model, scalar)
    assert isinstance(lw0, AttentionWgmmaLowering) and lw0.out_vectors is None
    assert "store_words" not in emit_plan(model, scalar, T).kernels[0].source


def test_softmax_chains_and_the_unconditional_rescale_print_proven_and_built(prefill, tmp_path):
    """`max_chains` = 4 and `sum_chains` = 2: the tile's row maxima in four chains joined by a tree, its sums in two
    added to l after the tile; proven like the default (max and field sums do not depend on the order), built with no
    spill and no serialized wgmma; the default keeps two max chains and l itself; 3 is not a value either takes."""
    from habu.emit_cuda.runtime import CompiledModel

    sizes = {**WIDE, "E": 64, "D": 64}
    model = prefill.with_sizes(sizes)
    pins = {"family": "attention", "main_loop": "wgmma"}
    plan = default_plan(model, T, sizes, {**pins, "max_chains": "4", "sum_chains": "2"})
    (kernel,) = plan.kernels
    assert isinstance(kernel, AttentionKernel) and (kernel.max_chains, kernel.sum_chains) == (4, 2)
    assert verify_plan(model, plan, sizes, trials=1, seeds=[4]).passed
    source = emit_plan(model, plan, T).kernels[0].source
    assert "mx[(((jn % 4) * 2) + h)] = fmaxf(mx[(((jn % 4) * 2) + h)]" in source
    assert "fmaxf(fmaxf(mx[h], mx[(2 + h)]), fmaxf(mx[(4 + h)], mx[(6 + h)]))" in source
    assert "ls[(((jn % 2) * 2) + h)] += s[" in source and "l[h] += (ls[h] + ls[(2 + h)]);" in source
    ((cubin,),) = CompiledModel(model, emit_plan(model, plan, T), cache_dir=tmp_path).compile("sm_90a")
    assert not cubin.resources.spills and not cubin.resources.wgmma_serialized, cubin.resources.describe()
    default = emit_plan(model, default_plan(model, T, sizes, pins), T).kernels[0].source
    assert "fmaxf(mx[h], mx[(2 + h)])" in default and "l[h] += s[" in default and "ls[" not in default
    for field in ("max_chains", "sum_chains"):
        with pytest.raises(UsageError, match=field):
            default_plan(model, T, sizes, {**pins, field: "3"})
    # O rescaled on every tile (`rescale_always`): no vote, the same field check
    always = default_plan(model, T, sizes, {**pins, "rescale_always": "true"})
    assert verify_plan(model, always, sizes, trials=1, seeds=[4]).passed
    text = emit_plan(model, always, T).kernels[0].source
    assert "__any_sync" not in text and "every tile (`rescale_always`)" in text and "__any_sync" in default


def test_exp_fma_prints_the_split_exponential_proven_and_built(prefill, tmp_path):
    """`exp_fma` = 2: two score groups of every 8 take their exponentials on the FMA pipes (habu::exp2_fma); the
    plan is proven like the default (the field check's exp is exp: the choice is the float code's) and builds with
    no spill and no serialized wgmma; the default prints the SFU's alone; 5 is not a value the field takes."""
    from habu.emit_cuda.runtime import CompiledModel

    sizes = {**WIDE, "E": 64, "D": 64}
    model = prefill.with_sizes(sizes)
    pins = {"family": "attention", "main_loop": "wgmma"}
    plan = default_plan(model, T, sizes, {**pins, "exp_fma": "2"})
    (kernel,) = plan.kernels
    assert isinstance(kernel, AttentionKernel) and kernel.main_loop == "wgmma" and kernel.exp_fma == 2
    assert verify_plan(model, plan, sizes, trials=1, seeds=[4]).passed
    emitted = emit_plan(model, plan, T)
    assert "habu::exp2_split<2>(fmaf(s[" in emitted.kernels[0].source
    ((cubin,),) = CompiledModel(model, emitted, cache_dir=tmp_path).compile("sm_90a")
    assert not cubin.resources.spills and not cubin.resources.wgmma_serialized, cubin.resources.describe()
    assert "exp2_split" not in emit_plan(model, default_plan(model, T, sizes, pins), T).kernels[0].source
    with pytest.raises(UsageError, match="exp_fma"):
        default_plan(model, T, sizes, {**pins, "exp_fma": "5"})
    # the mma.sync kernel prints it too (its score loop's 8-key groups)
    mma_sync = default_plan(model, T, sizes, {"family": "attention", "exp_fma": "2"})
    assert mma_sync.kernels[0].main_loop == "mma.sync"
    assert "habu::exp2_split<2>(sc[mi][jn][q]" in emit_plan(model, mma_sync, T).kernels[0].source


def test_kv_tiles_of_192_keys_are_searched_proven_at_head_width_64_and_refused_at_128(prefill):
    """bn = 192 (session 40: a 16k-key full prefill at head width 64 2.6% faster than 128-key tiles): in the search
    space; at head width 64 the rules pass and one trial over Z_q × GF(p) proves it (12 k steps of P·V, S a 64 × 192
    accumulator); at 128 the register budget refuses it (S, O and P would not fit the consumers' 240 registers)."""
    sizes = {**WIDE, "E": 64, "D": 64, "I": 300, "J": 500}
    model = prefill.with_sizes(sizes)
    (node,) = [e.target for e in model.nodes]
    space = list(region_space(model, Region("general", (node,)), T, sizes))
    assert any(isinstance(k, AttentionKernel) and k.main_loop == "wgmma" and k.bn == 192 for k in space)
    pins = {"family": "attention", "main_loop": "wgmma", "bn": "192", "persistent": "1"}
    plan = default_plan(model, T, sizes, pins)
    assert not failures(obligations(model, plan, sizes))
    assert verify_plan(model, plan, sizes, trials=1, seeds=[6]).passed
    wide = {**WIDE, "I": 300, "J": 500}
    refused = failures(obligations(prefill.with_sizes(wide), default_plan(prefill.with_sizes(wide), T, wide, pins), wide))
    assert any(o.rule.name == "register-budget" for o in refused), refused


def test_three_consumer_warpgroups_split_the_registers_32_160_and_fit_96_key_tiles_at_head_width_64(prefill):
    """bm = 192 (FlashAttention-3's head-width-64 tile; the default of a full prefill there since session 41, a pin
    with a mask): three consumer warpgroups, the producer at 32 registers and each consumer at 160 (all 512 threads'
    65536); KV tiles of 96 keys fit and are proven; of 128 the register budget refuses them with the causal mask
    (ptxas spilled 88-100 B) and takes them without (no spill)."""
    sizes = {**WIDE, "E": 64, "D": 64, "I": 300, "J": 500}
    model = prefill.with_sizes(sizes)
    pins = {"family": "attention", "main_loop": "wgmma", "bm": "192", "bn": "96"}
    plan = default_plan(model, T, sizes, pins)
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, AttentionWgmmaLowering) and lw.consumers == 3 and lw.threads == 512
    assert lw.split is not None and (lw.split.producer, lw.split.consumer) == (32, 160) and lw.split.fits
    assert not failures(obligations(model, plan, sizes))
    assert verify_plan(model, plan, sizes, trials=1, seeds=[2]).passed
    wide = default_plan(model, T, sizes, {**pins, "bn": "128"})
    assert any(o.rule.name == "register-budget" for o in failures(obligations(model, wide, sizes)))


@pytest.mark.parametrize("plant", ["third_slab_reads_the_first_q", "kv_boxes_in_one_stage", "rescale_inverted"])
def test_the_three_consumer_default_of_a_full_prefill_kills_planted_mistakes_in_what_it_prints(plant):
    """Session 41's default of a full prefill at head width 64 (192 query rows over 128-key tiles, 4 stages,
    persistent; `three_consumer_tile`), at a shape of two query tiles a sequence and two query heads walked by the
    check's grid: a mistake planted in its lowering (the third consumer's Q slab, the stage of K's boxes, the
    rescale) changes the CUDA the emitter prints and fails the finite-field check."""
    from habu.bench import mutants_attention_wgmma as planted
    from habu.bench.attention_speed import full_attention_source
    from habu.lower import lower_whole
    from habu.paths.emit import emit_lowered
    from habu.spec.parser import parse_text

    sizes = {"B": 1, "G": 1, "R": 2, "I": 384, "J": 300, "E": 64, "D": 64}
    model = parse_text(full_attention_source()).models["ATTENTION-FULL"].with_sizes(sizes)
    plan = default_plan(model, T, sizes)
    (k,) = plan.kernels
    assert isinstance(k, AttentionKernel) and (k.main_loop, k.bm, k.bn, k.stages, k.persistent) == ("wgmma", 192, 128,
                                                                                                        4, True)
    lowered = lower_whole(model, plan)
    mutated = getattr(planted, plant)(lowered.kernels[0])
    before = emit_lowered(lowered, plan, T).kernels[0].source
    after = emit_lowered(replace(lowered, kernels=(mutated,)), plan, T).kernels[0].source
    assert before != after
    assert verify_plan(model, plan, sizes, trials=1, seeds=[3]).passed
    assert not verify_plan(model, plan, sizes, trials=1, seeds=[3], lowerings=[mutated]).passed
