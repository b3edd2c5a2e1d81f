"""Planted bookkeeping bugs: the finite-field check rejects every one, naming an output element."""

from __future__ import annotations

import re

import pytest

from habu.bench.mutants import EQUIVALENT, MUTANTS, Mutant, run_mutant
from habu.bench.mutants_softmax import SOFTMAX_MUTANTS, run_softmax_mutant
from habu.plan.online_softmax import Variant


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_with_the_element_it_spoils(mutant):
    outcome = run_mutant(mutant)
    assert outcome.killed, f"{mutant.name} survived: {outcome.message}"
    # the message names an output element: "O[0, 1] differs ..." or "while computing O[256, 0] ..."
    assert re.search(r"[A-Za-z%0-9]+\[\d+(, \d+)*\]|row \d+ of \w+|element \d+", outcome.message), outcome.message


@pytest.mark.slow  # 22 s: every distinct base plan's field check
def test_the_unmutated_plans_pass():
    """Each distinct base plan of the mutants (example, model, shape, pins) passes unmutated; mutants
    that share one are checked once (all 80 one by one took three minutes of CI)."""
    from dataclasses import replace

    bases: dict[tuple, Mutant] = {}
    for m in MUTANTS:
        key = (m.example, m.model, tuple(sorted(m.shape.items())), tuple(sorted((m.pins or {}).items())))
        bases.setdefault(key, m)
    assert len(bases) < len(MUTANTS)
    for m in bases.values():
        outcome = run_mutant(replace(m, mutate=lambda lw: lw, index_width=None))
        assert not outcome.killed, f"{m.name}'s base plan fails: {outcome.message}"


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_at_the_witness_shape_the_search_checks(mutant):
    """The search checks each candidate once, on the reduced witness shape: every planted bug must
    show there too (one trial)."""
    outcome = run_mutant(mutant, trials=1, witness=True)
    assert outcome.killed, f"{mutant.name} survived at the witness shape: {outcome.message}"


# Mutants the emitted CUDA cannot show: planted in the plan rather than the lowering (the same plan is
# printed on both sides of the comparison).
NOT_PRINTED = {
    "int32-offset-wraps": "planted in the plan (its index width), not in the lowering",
}


@pytest.mark.parametrize("m", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_the_interpreter_kills_is_in_the_emitted_cuda(m):
    """The finite-field check runs the lowering; the emitter prints the CUDA from the same lowering.
    A mutant planted in the lowering must therefore change the printed CUDA: then the same bug planted
    in what the emitter prints is what the check ran, and is caught on the CPU."""
    from dataclasses import replace

    from habu.lower import lower_whole
    from habu.paths.emit import emit_lowered
    from habu.search.space import default_plan
    from habu.target import TARGETS

    target = TARGETS["sm_90a"]
    model = m.load_model()
    plan = default_plan(model, target, m.shape, m.pins)
    lowered = lower_whole(model, plan)
    kernels = list(lowered.kernels)
    kernels[m.kernel] = m.mutate(kernels[m.kernel])
    before = [k.source for k in emit_lowered(lowered, plan, target).kernels]
    after = [k.source for k in emit_lowered(replace(lowered, kernels=tuple(kernels)), plan, target).kernels]
    if m.name in NOT_PRINTED:
        assert before == after, f"{m.name} is printed now: take it off NOT_PRINTED"
    else:
        assert before != after, f"{m.name} changes what the interpreter runs but not the CUDA"


@pytest.mark.parametrize("mutant", EQUIVALENT, ids=lambda m: m.name)
def test_a_guard_the_row_loops_make_redundant_is_an_equivalent_mutant(mutant):
    """The check executes the column loops the kernel runs (the lowering's thread map): each ends at its
    part of the row, so dropping the reductions' column guard or the loads' column mask leaves the
    kernel correct, and the check must say so (a padded picture of the loops killed these: it ran
    columns no thread visits). The printed CUDA still changes: the guard is printed from the lowering."""
    from dataclasses import replace

    from habu.lower import lower_whole
    from habu.paths.emit import emit_lowered
    from habu.search.space import default_plan
    from habu.target import TARGETS

    outcome = run_mutant(mutant)
    assert not outcome.killed, outcome.message
    target = TARGETS["sm_90a"]
    model = mutant.load_model()
    plan = default_plan(model, target, mutant.shape, mutant.pins)
    lowered = lower_whole(model, plan)
    mutated = replace(lowered, kernels=(mutant.mutate(lowered.kernels[0]),))
    assert emit_lowered(lowered, plan, target).kernels[0].source != emit_lowered(mutated, plan, target).kernels[0].source


# ----------------------------------------------------------------------------- the online softmax


@pytest.mark.parametrize("mutant", SOFTMAX_MUTANTS, ids=lambda m: m.name)
def test_online_softmax_mutant_is_killed_on_the_cpu(mutant):
    outcome = run_softmax_mutant(mutant)
    assert outcome.killed, f"{mutant.name} survived: {outcome.message}"
    assert re.search(r"O\[\d+(, \d+)*\]", outcome.message), outcome.message


def test_the_correct_online_softmax_passes_on_the_mutants_models():
    from dataclasses import replace

    for m in SOFTMAX_MUTANTS[:2]:  # the prefill and decode models
        outcome = run_softmax_mutant(replace(m, variant=Variant.CORRECT))
        assert not outcome.killed, outcome.message
