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
