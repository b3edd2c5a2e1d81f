"""Every example model, forward and backward, compiles at odd sizes: each extent in turn at 1 and at 17, the
default plan proven (rules and a finite-field trial) and its CUDA compiled by NVRTC, or a one-line refusal of the
shape. Session 45 swept this by hand (sizes 1, 17 and 300, sm_90a and sm_80, the general corpus too) and found a
witness that lost a class (`habu compile examples/attention.habu --backward --shape D=1`: a traceback), a scalar's
box the check could not index, a row broadcast with no input along the row, a backward refusing the forward's
--shape, and a constant index a shape put out of bounds; this keeps the examples' part of that sweep in CI."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from habu.cli_grad import backward_program
from habu.cli_options import extents_of
from habu.compile import compile_model, write_outputs
from habu.errors import UsageError
from habu.spec.parser import load_program
from habu.target import target_named
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.slow

SIZES = (1, 17)
CASES = [(path, name) for path in EXAMPLES for name in load_program(path).models]
# an MoE's backward without a token count compiles size buckets (minutes): its backward is in test_backward_plans
FORWARD_ONLY = ("moe_",)


def _compile_at_odd_sizes(path: Path, name: str, backward: bool) -> list[str]:
    forward = load_program(path).models[name]
    refused = []
    for extent in forward.extents:
        for size in SIZES:
            if extent.size == size:
                continue
            program, model = load_program(path), name
            if backward:
                program, model = backward_program(program, name, None, "auto")
            sizes = extents_of(program.model(model), {extent.name: size})
            try:
                compiled = compile_model(program, model, sizes, target_named("sm_90a"), {}, 1)
            except UsageError as err:  # a size outside a declared range: the shape's refusal, one line
                assert "outside" in str(err) and "declared range" in str(err), err
                refused.append(f"{extent.name}={size}")
                continue
            with tempfile.TemporaryDirectory() as out:
                write_outputs(Path(out), compiled.model, compiled, target_named("sm_90a"))
            assert all(p.ok for p in compiled.proofs), (extent.name, size)
    return refused


@pytest.mark.parametrize(("path", "name"), CASES, ids=[f"{p.stem}-{n}" for p, n in CASES])
def test_the_default_plan_compiles_at_odd_sizes(path, name):
    _compile_at_odd_sizes(path, name, backward=False)


@pytest.mark.parametrize(("path", "name"), [c for c in CASES if not c[0].name.startswith(FORWARD_ONLY)],
                         ids=[f"{p.stem}-{n}" for p, n in CASES if not p.name.startswith(FORWARD_ONLY)])
def test_the_backward_plan_compiles_at_odd_sizes(path, name):
    _compile_at_odd_sizes(path, name, backward=True)
