"""Emitted sources stay byte-identical across refactors: every recorded plan (each example's default
and a seeded sample of legal plans, tests/data/emitted_sources.json) is emitted again from its stored
JSON and hashed. A change on purpose re-records them (`python -m tests.emit_cuda.emitted_snapshot
--write`) and says why in its commit."""

from __future__ import annotations

import json

from tests.emit_cuda.emitted_snapshot import SNAPSHOT, default_cases, digest, plan_choices, recorded_plans


def test_every_recorded_plan_emits_the_recorded_source():
    recorded = json.loads(SNAPSHOT.read_text())
    assert len(recorded) >= 200
    moved = [cid for cid, model, plan, arch in recorded_plans() if digest(model, plan, arch) != recorded[cid]["sha256"]]
    assert not moved, f"{len(moved)} of {len(recorded)} plans emit other sources: {moved[:8]}"


def test_every_examples_default_plan_is_the_recorded_one():
    """A change of a default plan (a new rule in the search space, a moved threshold) is visible in review:
    the default of every example model on every recorded target must be the recorded one. A change on
    purpose records them again: `python -m tests.emit_cuda.emitted_snapshot --defaults`."""
    recorded = json.loads(SNAPSHOT.read_text())
    missing, moved = [], []
    for cid, _model, plan, _arch in default_cases():
        if cid not in recorded:
            missing.append(cid)
        elif plan_choices(recorded[cid]["plan"]) != plan_choices(plan.to_json()):
            moved.append(cid)
    assert not missing and not moved, f"defaults not recorded: {missing[:6]}; defaults that changed: {moved[:6]}"
