"""The fused attention family (issue 22, `--pin family=attention`): reachable by the pin and the search, not
the default; its plans of examples/attention.habu (causal GQA prefill) and examples/decode_attention.habu
(lengths) proven by the rules and the check over Z_q × GF(p); the causal skip's rule rejects a skip of one
tile too many; the emitted source carries the online softmax as the lowering defines it. (The planted
softmax mistakes are in the mutation suite: tests/bench/test_mutants.py, `attention-*`.)"""

from __future__ import annotations

import pytest

from habu.bench.mutants_attention import PINS, SHAPE, skip_one_tile_too_many
from habu.lower import lower_plan
from habu.paths import region_space
from habu.paths.emit import emit_plan
from habu.plan.attention_split import attention_form
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

EX = ROOT / "examples"
T = TARGETS["sm_90a"]
DECODE = {"B": 4, "G": 2, "R": 2, "J": 50, "L": 51, "E": 16, "D": 16}


@pytest.fixture(scope="module")
def prefill():
    return load_program(EX / "attention.habu").models["ATTENTION-GQA"].with_sizes(SHAPE)


def test_the_fused_kernel_is_pinned_not_the_default(prefill):
    default = default_plan(prefill, T, SHAPE)
    assert default.rewrites[0] == "attention:O" and not any(isinstance(k, AttentionKernel) for k in default.kernels)
    fused = default_plan(prefill, T, SHAPE, PINS)
    assert fused.rewrites == () and fused.kernels == (AttentionKernel(nodes=("O",), bm=32, bn=32),)


def test_the_search_space_of_the_unrewritten_node_offers_the_fused_kernel(prefill):
    kernels = list(region_space(prefill, Region("general", ("O",)), T, SHAPE))
    fused = [k for k in kernels if isinstance(k, AttentionKernel)]
    assert fused and len({(k.bm, k.bn) for k in fused}) == len(fused) > 4
    assert kernels[0].kind == "general"  # the general kernel stays the region's first candidate


def test_the_fused_prefill_is_proven_and_prints_the_online_softmax(prefill):
    plan = default_plan(prefill, T, SHAPE, PINS)
    assert not failures(obligations(prefill, plan, SHAPE))
    cert = verify_plan(prefill, plan, SHAPE, trials=1)
    assert cert.passed, cert.failure
    assert any("Z_1073741789" in n for n in cert.notes)
    src = emit_plan(prefill, plan, T).kernels[0].source
    assert "habu::row_max_lanes<1, 2>(mx[h])" in src and "alpha[mi][h] = habu::exp2_fast((m[mi][h] - shift[mi][h]));" in src
    assert "m[mi][h] = m_new;" in src and "ldmatrix_x4_trans" in src
    # the causal limit: key j ≤ i + #J − #I at the tile's last row, 32 tiles
    assert "const long long limit = (31 + ((((long long)qt * 32) + 32) - 1));" in src


def test_the_fused_decode_with_lengths_is_proven():
    model = load_program(EX / "decode_attention.habu").models["DECODE-ATTENTION"].with_sizes(DECODE)
    form = attention_form(model, "O")
    assert form is not None and form.row.name == "r" and [v.name for v in form.batch] == ["b", "g"]
    plan = default_plan(model, T, DECODE, {"family": "attention", "bm": "16", "bn": "32"})
    assert not failures(obligations(model, plan, DECODE))
    cert = verify_plan(model, plan, DECODE, trials=1)
    assert cert.passed, cert.failure


def _rule_refuses(model, rule: str, planted) -> None:
    """`rule` holds for the pinned plan's lowering and fails for `planted(lowering)`."""
    plan = default_plan(model, T, SHAPE, PINS)
    ctx = context(model, plan, SHAPE)
    lw = lower_plan(model, plan)[0]
    good = [discharge(o, ctx) for o in attention_obligations("k0", lw, ctx) if o.rule.name == rule]
    bad = [discharge(o, ctx) for o in attention_obligations("k0", planted(lw), ctx) if o.rule.name == rule]
    assert len(good) == len(bad) == 1
    assert not failures(good) and failures(bad)


def test_the_skip_rule_rejects_one_tile_too_many(prefill):
    _rule_refuses(prefill, "attention-skip", skip_one_tile_too_many)


def test_the_attention_family_pin_on_a_model_without_attention_is_a_usage_error():
    from habu.errors import UsageError

    model = load_program(EX / "ggemm.habu").models["GGEMM"]
    with pytest.raises(UsageError, match="no region of GGEMM can be computed by the attention family"):
        default_plan(model, T, {"M": 64, "N": 64, "K": 64}, {"family": "attention"})


def test_regression_the_search_report_names_an_attention_kernel():
    """The search's table printed a fused attention kernel as a map kernel (KeyError: 'threads')."""
    from habu.search.report import plan_summary

    plan = default_plan(load_program(EX / "attention.habu").models["ATTENTION-GQA"].with_sizes(SHAPE), T, SHAPE, PINS)
    assert plan_summary(plan.to_json()) == "attention 32x32 (fused)"


def test_the_golden_tolerance_counts_the_bf16_weights_inside_the_fused_kernel(prefill):
    """P is rounded to bf16 before P·V: a plan of one fused kernel into an f32 O is checked like a bf16 stage."""
    from habu.timing.harness import tolerance

    plan = default_plan(prefill, T, SHAPE, PINS)
    assert tolerance(prefill, dict(plan.storage)) == 1e-4
    assert tolerance(prefill, dict(plan.storage), plan.kernels) == 2e-2


def test_the_fused_kernels_compile_without_spills(prefill, tmp_path):
    """The emitted CUDA builds for sm_90a with no GPU (NVRTC, or nvcc where it cannot be loaded): the causal
    prefill with two 16-row tiles a warp (bm 128, bn 32) and the decode, whole and split-KV, within the
    registers, no spill."""
    from habu.emit_cuda.runtime import CompiledModel

    wide, wide_decode = {**SHAPE, "E": 128, "D": 128}, {**DECODE, "E": 128, "D": 128}  # head width 128
    decode = load_program(EX / "decode_attention.habu").models["DECODE-ATTENTION"].with_sizes(wide_decode)
    for model, sizes, pins in ((prefill.with_sizes(wide), wide, {**PINS, "bm": "128", "warp_m": "2"}),
                               (decode, wide_decode, {"family": "attention", "bm": "16"}),
                               (decode, wide_decode, {"family": "attention", "bm": "16", "kv_split": "32"})):
        plan = default_plan(model, T, sizes, pins)
        ((cubin,),) = CompiledModel(model, emit_plan(model, plan, T), cache_dir=tmp_path).compile("sm_90a")
        assert cubin.cubin.startswith(b"\x7fELF") and not cubin.resources.spills, cubin.resources.describe()


def test_the_open_tile_rule_rejects_the_mask_dropped_one_tile_early(prefill):
    from habu.bench.mutants_attention import mask_dropped_one_tile_early

    _rule_refuses(prefill, "attention-open-tile", mask_dropped_one_tile_early)


def test_the_staging_fragment_and_kv_loop_rules_refuse_planted_maps(prefill):
    """The maps moved into the lowering (copies, staged arrays, fragment loop counts, the warps' row tiles,
    the KV loop's step and buffers) are covered by z3 rules: they hold for the pinned plan (two row tiles
    a warp) and each planted map fails its rule. (Permutations that stay in range, a register decode
    transposed or B registers swapped, are the field check's: tests/bench/test_mutants.py.)"""
    from habu.bench import mutants_attention as att

    plan = default_plan(prefill, T, SHAPE, {**PINS, "warp_m": "2"})
    ctx = context(prefill, plan, SHAPE)
    lw = lower_plan(prefill, plan)[0]
    ours = ("attention-staging", "attention-fragments", "attention-kv-loop")
    good = [discharge(o, ctx) for o in attention_obligations("k0", lw, ctx) if o.rule.name in ours]
    assert {o.rule.name for o in good} == set(ours) and not failures(good)
    for planted, rule in ((att.score_groups_one_short, "attention-fragments"),
                          (att.row_tile_ignores_mi, "attention-fragments"),
                          (att.copy_one_chunk_short, "attention-staging"),
                          (att.staged_column_shifted, "attention-staging"),
                          (att.next_tile_skips_one, "attention-kv-loop"),
                          (att.next_tile_same_buffer, "attention-kv-loop")):
        bad = [discharge(o, ctx) for o in attention_obligations("k0", planted(lw), ctx) if o.rule.name == rule]
        assert failures(bad), planted.__name__
