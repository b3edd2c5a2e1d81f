"""Every row-kernel plan the GPU golden tests build (tests/gpu/row_cases.py) proves on the CPU: the rules and a
finite-field trial, as `habu.bench.run.build` asks before it launches. A prefetching cluster's plan failed its
field check for two days unnoticed (session 42: the interpreter kept one next-row buffer for a whole cluster)
because only the GPU suite built it."""

from __future__ import annotations

import pytest

from habu.prove import prove
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.gpu.row_cases import PREFETCH_CASES, ROW_COLUMNS, ROW_EXAMPLES, ROW_VARIANTS, row_case_skip

T = TARGETS["sm_90a"]


def _proof(example: str, model: str, sizes: dict[str, int], pins: dict[str, str]):
    m = load_program(ROOT / "examples" / example).models[model].with_sizes(sizes)
    return prove(m, default_plan(m, T, sizes, pins), sizes, trials=1)


def _why(proof) -> str:
    return str([o.describe() + ": " + o.detail for o in proof.violations] or proof.certificate.failure)


@pytest.mark.parametrize("cols", ROW_COLUMNS)
@pytest.mark.parametrize("variant", list(ROW_VARIANTS))
@pytest.mark.parametrize("example, model, key", ROW_EXAMPLES, ids=["softmax", "rmsnorm"])
def test_every_row_variant_the_gpu_builds_is_proven(example, model, key, variant, cols):
    why = row_case_skip(variant, cols)
    if why and why != "vector-align":
        pytest.skip(why)
    proof = _proof(example, model, {"R": 64, key: cols}, ROW_VARIANTS[variant])
    if why == "vector-align":  # the GPU test expects the rules to refuse it
        assert not proof.ok and "vector-align" in _why(proof)
    else:
        assert proof.ok, _why(proof)


@pytest.mark.parametrize("case", list(PREFETCH_CASES))
def test_every_prefetching_plan_the_gpu_builds_is_proven(case):
    example, model, key, cols, pins = PREFETCH_CASES[case]
    proof = _proof(example, model, {"R": 1500, key: cols}, pins | {"row_prefetch": "true", "cache_row": "true"})
    assert proof.ok, _why(proof)
