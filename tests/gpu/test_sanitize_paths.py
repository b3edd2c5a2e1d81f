"""compute-sanitizer's memcheck, racecheck and synccheck on one small plan per emitter path (run
through the device tool; slow: each case starts Python under the sanitizer)."""

from __future__ import annotations

import pytest

from habu.bench.sanitize_paths import CASES, TOOLS, find_sanitizer, run_case, sanitize

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)
SANITIZER = find_sanitizer()
if SANITIZER is None:  # pragma: no cover
    pytest.skip("compute-sanitizer is not installed", allow_module_level=True)


@pytest.mark.parametrize("tool", TOOLS)
@pytest.mark.parametrize("case", list(CASES))
def test_no_sanitizer_errors(case, tool):
    run_case(case)  # compiles into the cache outside the sanitizer (and must pass its own check)
    errors, text = sanitize(case, tool, SANITIZER)
    assert errors == 0, text[-6000:]
