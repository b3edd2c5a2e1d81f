"""Planted bookkeeping bugs: the finite-field check rejects every one, naming an output element."""

from __future__ import annotations

import re

import pytest

from habu.bench.mutants import MUTANTS, run_mutant


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_with_the_element_it_spoils(mutant):
    outcome = run_mutant(mutant)
    assert outcome.killed, f"{mutant.name} survived: {outcome.message}"
    # the message names an output element: "O[0, 1] differs ..." or "while computing O[256, 0] ..."
    assert re.search(r"[A-Za-z%0-9]+\[\d+(, \d+)*\]|row \d+ of \w+|element \d+", outcome.message), outcome.message


def test_the_unmutated_plans_pass():
    from dataclasses import replace

    for m in MUTANTS:
        outcome = run_mutant(replace(m, mutate=lambda lw: lw, index_width=None))
        assert not outcome.killed, f"{m.name}'s base plan fails: {outcome.message}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_at_the_witness_shape_the_search_checks(mutant):
    """The search checks each candidate once, on the reduced witness shape: every planted bug must
    show there too (one trial)."""
    outcome = run_mutant(mutant, trials=1, witness=True)
    assert outcome.killed, f"{mutant.name} survived at the witness shape: {outcome.message}"
