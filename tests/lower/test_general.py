"""The general kernel family: every model of the corpus compiles (default plan, z3 rules, finite-field
check, CUDA printed from the proof) or is refused as `FILE:LINE:COL: error:`; the specialised
families keep the nodes they take."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from habu.compile import compile_model
from habu.errors import HabuError
from habu.lower import GeneralLowering, lower_plan
from habu.paths.emit import emit, emit_plan
from habu.plan.patterns import default_regions, row_local
from habu.plan.plan import GeneralKernel, Plan
from habu.prove import prove
from habu.prove.rules import failures, obligations
from habu.prove.verify import verify_plan
from habu.search.space import default_plan, enumerate_plans
from habu.spec.parser import load_program, parse_text
from habu.target import TARGETS
from tests.conftest import ERROR_HEAD, ROOT

CORPUS = sorted((ROOT / "tests" / "data" / "general_corpus").glob("*.habu"))
TARGET = TARGETS["sm_90a"]


def expected_error(path: Path) -> str | None:
    first = path.read_text().splitlines()[0]
    return first.split("expect-error:", 1)[1].strip() if "expect-error:" in first else None


def test_the_corpus_is_large_enough():
    """Issue 19: at least 40 equations, scatter stores and accumulates among them."""
    compiled = [p for p in CORPUS if expected_error(p) is None]
    assert len(CORPUS) >= 40 and len(compiled) >= 35
    texts = [p.read_text() for p in compiled]
    assert sum("+=" in t and "[IX[" in t for t in texts) >= 5  # scatters
    assert sum("+=" in t and "[IX[" not in t for t in texts) >= 5  # plain accumulates


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.stem)
def test_corpus_model_compiles_and_passes_the_finite_field_check(path):
    fragment = expected_error(path)
    if fragment is not None:  # refused by habu check (the parser) or by the compiler, never a traceback
        with pytest.raises(HabuError) as info:
            program = load_program(path)
            (name,) = program.models
            compile_model(program, name, {}, TARGET, {}, trials=1)
        head = ERROR_HEAD.match(info.value.render().splitlines()[0])
        assert head and head.group("path") == str(path), info.value.render()
        assert fragment in info.value.message
        return
    program = load_program(path)
    (name,) = program.models
    compiled = compile_model(program, name, {}, TARGET, {}, trials=2)
    for proof in compiled.proofs:
        assert proof.ok and proof.certificate is not None and proof.certificate.passed
        emitted = emit(proof, TARGET)
        assert len(emitted.kernels) == len(proof.plan.kernels)
        for kernel, lw in zip(emitted.kernels, proof.lowered.kernels, strict=True):  # type: ignore[union-attr]
            if isinstance(lw, GeneralLowering):
                assert "general" in kernel.source and f"__launch_bounds__({lw.kernel.threads})" in kernel.source


def test_the_scores_example_is_one_general_kernel_with_its_loop_printed_from_the_lowering():
    model = load_program(ROOT / "examples" / "weighted_scores.habu").models["SCORES"]
    assert [r.kind for r in default_regions(model)] == ["general"]
    plan = default_plan(model, TARGET, {}, {})
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, GeneralLowering) and lw.loops == (("k0", "D"),)
    (kernel,) = emit_plan(model, plan, TARGET).kernels
    assert "for (int k0 = 0; k0 < 64; ++k0)" in kernel.source
    assert "const int e0 = (int)(((e / 128) / 128));" in kernel.source


def test_specialised_families_keep_priority():
    for path, kinds in (("gemm.habu", ["contraction"]), ("softmax.habu", ["rows"]), ("fused.habu", ["map"])):
        program = load_program(ROOT / "examples" / path)
        (model,) = program.models.values()
        assert [r.kind for r in default_regions(model)] == kinds


def test_general_kernel_plan_round_trips_through_json():
    model = load_program(ROOT / "examples" / "weighted_scores.habu").models["SCORES"]
    plan = default_plan(model, TARGET, {}, {"threads": "128"})
    assert plan.kernels == (GeneralKernel(nodes=("S",), threads=128, index_width=32),)
    assert Plan.from_json(json.loads(plan.dumps())) == plan


def test_general_kernel_json_with_a_bad_thread_count_is_a_habu_error():
    model = load_program(ROOT / "examples" / "bias_grad.habu").models["BIAS-GRAD"]
    data = default_plan(model, TARGET, {}, {}).to_json()
    data["kernels"][0]["threads"] = 2048
    with pytest.raises(HabuError, match="threads"):
        Plan.from_json(data)


def test_the_search_space_walks_thread_counts_of_the_general_kernel():
    model = load_program(ROOT / "examples" / "weighted_scores.habu").models["SCORES"]
    threads = sorted({p.kernels[0].threads for p in enumerate_plans(model, TARGET)})  # type: ignore[union-attr]
    assert threads == [64, 128, 256, 512, 1024]


def test_int32_rules_flag_an_output_past_two_to_the_31_elements():
    text = ("65536 EXTENT: #R  65536 EXTENT: #N  2 EXTENT: #K\n"
            "f32 TENSOR: X ( #R #K )  f32 TENSOR: Y ( #N #K )  f32 TENSOR: O ( #K #R #N )\n"
            "MODEL: BIG  O[k r n] = Σ k2 X[r k2] · Y[n k2] · X[r k] ;\n")
    model = parse_text(text, "big.habu").models["BIG"]
    plan = default_plan(model, TARGET, {}, {})
    assert plan.kernels[0].index_width == 64  # the default already widens
    narrow = replace(plan, kernels=(replace(plan.kernels[0], index_width=32),))
    bad = failures(obligations(model, narrow))
    assert any(o.rule.name == "int32-offsets" for o in bad), [o.describe() for o in bad]
    assert not failures(obligations(model, plan))


def test_a_general_kernel_proof_covers_its_accesses_and_threads():
    model = load_program(ROOT / "examples" / "weighted_scores.habu").models["SCORES"]
    proof = prove(model, default_plan(model, TARGET, {}, {}), {}, trials=1)
    rules = {o.rule.name for o in proof.obligations}
    assert {"bounds", "int32-offsets", "threads", "grid-dims"} <= rules
    assert proof.ok


def test_a_missing_store_guard_is_caught_at_the_last_block():
    """The check runs the threads past the last element of the final block: a kernel that lets them
    store (its guard dropped) faults."""
    from habu.bench.mutants import MUTANTS, run_mutant

    (m,) = [m for m in MUTANTS if m.name == "general-store-unmasked"]
    outcome = run_mutant(m, trials=1)
    assert outcome.killed and "out of bounds" in outcome.message


def test_regression_row_local_refuses_three_dimensional_loads():
    """`O[b] = Σ i X[b i i]` was taken as a row kernel (a 3-index load passed row_local unchecked) and
    the finite-field reference then crashed on the row kernel's output box; it is a general kernel now."""
    text = ("4 EXTENT: #B  9 EXTENT: #I\nf32 TENSOR: X ( #B #I #I )  f32 TENSOR: O ( #B )\n"
            "MODEL: BT  O[b] = Σ i X[b i i] ;\n")
    model = parse_text(text, "bt.habu").models["BT"]
    assert row_local(model.nodes[0]) is None
    assert [r.kind for r in default_regions(model)] == ["general"]
    plan = default_plan(model, TARGET, {}, {})
    assert verify_plan(model, plan, trials=1).passed


def test_regression_a_node_no_family_computes_was_a_traceback():
    """`habu compile` raised NotImplementedError for a node no family took (and the map family for a
    gather through a gather); a node still impossible is a HabuError naming it, at the model."""
    text = ("8 EXTENT: #M  4 EXTENT: #K\nf32 TENSOR: A ( #M #K )  f32 TENSOR: O ( #M #K )\n"
            "ITENSOR: P ( #M #M )  ITENSOR: Q ( #M #M )\nMODEL: GG  O[m k] = A[P[Q[m]] k] ;\n")
    program = parse_text(text, "gg.habu")
    with pytest.raises(HabuError, match="no kernel family computes O") as info:
        compile_model(program, "GG", {}, TARGET, {}, trials=1)
    assert info.value.render().startswith("gg.habu:4:8: error:")


def test_an_in_place_reduction_reads_each_element_before_its_thread_writes_it():
    """`G[n] = Σ r G[n] · X[r n]` updates G in place: one thread per element reads G[n], then stores."""
    text = "8 EXTENT: #R  6 EXTENT: #N\nf32 TENSOR: X ( #R #N )  f32 TENSOR: G ( #N )\n" \
           "MODEL: SELF  G[n] = Σ r G[n] · X[r n] ;\n"
    model = parse_text(text, "self.habu").models["SELF"]
    assert "G" in {t.name for t in model.inputs}
    plan = default_plan(model, TARGET, {}, {})
    assert [k.kind for k in plan.kernels] == ["general"]
    cert = verify_plan(model, plan, trials=2)
    assert cert.passed, cert.failure


def test_regression_a_scalar_elementwise_node_crashed_the_map_check():
    """`S = X[3] · 2 + 1` (no reduction, a scalar output) went to the map family, whose lanes would
    all store the scalar, and its check raised a numpy ValueError; one general thread computes it now."""
    text = "4 EXTENT: #N\nf32 TENSOR: X ( #N )  f32 TENSOR: S ( )\nMODEL: SC  S = X[3] · 2 + 1 ;\n"
    model = parse_text(text, "sc.habu").models["SC"]
    assert [r.kind for r in default_regions(model)] == ["general"]
    assert verify_plan(model, default_plan(model, TARGET, {}, {}), trials=1).passed


def test_regression_a_three_dimensional_map_was_refused_as_never_written():
    """The map's checked box was the product of the coordinates its sampled blocks touch; where a
    block is not whole rows that box holds elements no sampled block computes, and a correct plan
    failed ("Y[0, 0, 991] was never written"). The blocks covering the box run now."""
    text = ("3 EXTENT: #A  1000 EXTENT: #B  999 EXTENT: #C\n"
            "f32 TENSOR: X ( #A #B #C )  f32 TENSOR: Y ( #A #B #C )\nMODEL: M3  Y[a b c] = X[a b c] · 2 ;\n")
    model = parse_text(text, "m3.habu").models["M3"]
    plan = default_plan(model, TARGET, {}, {})
    assert [k.kind for k in plan.kernels] == ["map"]
    cert = verify_plan(model, plan, trials=1)
    assert cert.passed, cert.failure


def test_regression_a_refusal_found_while_choosing_size_buckets_had_no_place():
    """compile_model looked for row widths to bucket (default_regions) before compiling, and a node no
    family computes was refused as `habu: error: ...` without FILE:LINE:COL."""
    path = ROOT / "tests" / "data" / "general_corpus" / "nested_gather_error.habu"
    program = load_program(path)
    with pytest.raises(HabuError) as info:
        compile_model(program, "GG", {}, TARGET, {}, trials=1)
    assert info.value.render().startswith(f"{path}:5:8: error: no kernel family computes O")


def test_a_general_thread_map_striding_blocks_wrong_is_caught_by_the_field_check():
    """The element a thread computes comes from the lowering's thread map (`FlatThreads`), which the
    emitter prints as `e` and the interpreter runs for every launched thread: a map striding blocks by
    threads + 32 leaves 32 elements of each block's share uncomputed, and the CPU check names one.
    (At the witness shape the output fits one block, where no block stride is executed: the full shape
    is checked here.)"""
    from dataclasses import replace

    from habu.bench.mutants import BMM, Mutant, run_mutant

    m = Mutant("general-element-stride-wrong", "blocks strided by threads + 32", "weighted_scores.habu", "SCORES",
               BMM, lambda lw: replace(lw, thread_map=replace(lw.thread_map, threads=lw.thread_map.threads + 32)))
    outcome = run_mutant(m, trials=1)
    assert outcome.killed and "S[" in outcome.message, outcome.message


CAUSAL_MASK = """4 EXTENT: #B  64 EXTENT: #I  64 EXTENT: #J
bf16 TENSOR: S ( #B #I #J )  bf16 TENSOR: P ( #B #I #J )
MODEL: CAUSAL-MASK
  P[b i j] = where(j ≤ i, S[b i j] · 0.5, −∞) ;
"""


def test_regression_a_vector_general_kernel_masks_each_element_at_its_own_index():
    """A general kernel moving 8 elements a thread printed every element's condition at the first element's
    index (`j` of element 0 for all 8), while the finite-field check ran each at its own (`lane_coordinates`):
    proven, and on the H200 the unfused causal attention at 256 and 512 queries differed from SDPA by 118× its
    largest value (session 37, `attention_speed --only short-`). The conditions now print element j's
    coordinates from `lane_coordinates`: planting that map moves the printed conditions."""
    from habu.bench.derived_lines import _with_override
    from habu.lower import lower_whole
    from habu.paths.emit import emit_lowered

    model = parse_text(CAUSAL_MASK).models["CAUSAL-MASK"]
    plan = default_plan(model, TARGET, {}, {"vector": "8"})
    (lw,) = lower_plan(model, plan)
    assert isinstance(lw, GeneralLowering) and lw.vector == 8
    proof = prove(model, plan, trials=1)
    assert proof.ok
    source = emit(proof, TARGET).kernels[0].source
    for j in range(1, 8):
        assert f"(long long)(e2 + {j})" in source, f"element {j}'s mask does not read its own column"
    planted = _with_override(lw, "lane_coordinates", lambda sup, coord, j: sup(coord, (j + 1) % 8))
    whole = lower_whole(model, plan)
    moved = emit_lowered(replace(whole, kernels=(planted,)), plan, TARGET).kernels[0].source
    assert moved != source and "(long long)(e2 + 1) + 0LL) <=" in moved.split("y[0] =")[1].split(";")[0]
