"""The equation is the program: a random well-typed model (tests/random_models.py) and its derived backward either
compile to a proven plan (the rules, a finite-field trial, NVRTC) or are refused in one line naming why (a
HabuError that is not a plan the proof found wrong). A default plan the field check refuses is a bug in the
planner, a lowering or an evaluator: session 45's fuzz found eight, each now a regression test."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from habu.cli_grad import backward_program
from habu.compile import compile_model, write_outputs
from habu.errors import HabuError
from habu.spec.parser import parse_text
from habu.target import target_named
from tests.random_models import random_model

pytestmark = pytest.mark.slow

SEEDS = range(5000, 5040)


def _compile(text: str, backward: bool) -> str:
    """'ok', or the one line a refusal gave; raises on a plan the proof found wrong or any other exception."""
    program, name = parse_text(text, "fuzz.habu"), "FZ"
    try:
        if backward:
            program, name = backward_program(program, name, None, "auto")
        compiled = compile_model(program, name, {}, target_named("sm_90a"), {}, 1)
    except HabuError as err:
        first = str(err).splitlines()[0]
        assert "computes something else" not in first and "breaks rule" not in first, f"{first}\n{text}"
        return first
    with tempfile.TemporaryDirectory() as out:
        write_outputs(Path(out), compiled.model, compiled, target_named("sm_90a"))
    assert all(p.ok for p in compiled.proofs), text
    return "ok"


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_model_and_its_backward_compile_or_are_refused_in_one_line(seed):
    text = random_model(seed)
    try:
        parse_text(text, "fuzz.habu")
    except HabuError:
        pytest.skip("the generator drew a model the checker refuses")
    assert _compile(text, backward=False) == "ok", text
    _compile(text, backward=True)


def test_the_generator_draws_varied_models():
    """The fuzz is worth its time only if its models vary: reductions of both kinds, gathers, several shapes."""
    texts = [random_model(s) for s in SEEDS]
    assert sum("max" in t for t in texts) >= 4 and sum("Σ" in t for t in texts) >= 10
    assert sum("ITENSOR" in t for t in texts) >= 5 and len({t.splitlines()[0] for t in texts}) >= 20
