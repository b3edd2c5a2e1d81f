"""The sanitizer driver's bookkeeping on the CPU: every emitter path has a case, and the error
count is read from compute-sanitizer's summary."""

from __future__ import annotations

from habu.bench.run import build
from habu.bench.sanitize_paths import CASES, example_path, sanitizer_errors


def test_the_error_summary_is_read():
    assert sanitizer_errors("========= ERROR SUMMARY: 0 errors\n") == 0
    assert sanitizer_errors("========= Invalid __global__ write\n========= ERROR SUMMARY: 3 errors\n") == 3
    assert sanitizer_errors("========= ERROR SUMMARY: 1 error\n") == 1
    assert sanitizer_errors("========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)\n") == 1
    assert sanitizer_errors("Traceback (most recent call last): ...") is None  # no summary: counted as failed


def test_every_emitter_path_has_a_case():
    kinds = set()
    for path, model, sizes, pins in CASES.values():
        built = build(example_path(path), model, sizes, pins)
        for k in built.plan.kernels:
            kinds.add(getattr(k, "mma", None) or type(k).__name__)
            kinds |= {f"{getattr(k, 'mma', '')}-{m}" for m in (getattr(k, "a_move", None), getattr(k, "b_move", None)) if m}
            if getattr(k, "split_k", 1) > 1:
                kinds.add("split-k")
    assert {"fma", "mma.sync", "wgmma", "RowKernel", "MapKernel", "ColumnKernel", "split-k", "wgmma-tma",
            "wgmma-cp.async", "wgmma-staged", "GeneralKernel", "GroupedKernel", "AttentionKernel"} <= kinds, kinds


def test_regression_the_fused_attention_cases_golden_counts_its_bf16_weights():
    """run_case's golden took the f32 output's 1e-4 for the fused attention kernels, whose P is rounded to bf16
    inside the kernel (2e-2): their sanitizer cases would fail on a right kernel."""
    from habu.bench.sanitize_paths import CASES, golden_tolerance
    from habu.search.space import default_plan
    from habu.spec.parser import load_program
    from habu.target import TARGETS

    for case in ("attention-fused", "attention-split-kv"):
        path, name, sizes, pins = CASES[case]
        model = load_program(example_path(path)).models[name].with_sizes(sizes)
        assert golden_tolerance(model, default_plan(model, TARGETS["sm_90a"], sizes or None, pins)) == 2e-2
