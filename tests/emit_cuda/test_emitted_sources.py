"""Emitted sources stay byte-identical across refactors: every recorded plan (each example's default
and a seeded sample of legal plans, tests/data/emitted_sources.json) is emitted again from its stored
JSON and hashed. A change on purpose re-records them (`python -m tests.emit_cuda.emitted_snapshot
--write`) and says why in its commit."""

from __future__ import annotations

import json

from habu.plan.plan import Plan
from habu.spec.parser import load_program
from tests.conftest import ROOT
from tests.emit_cuda.emitted_snapshot import SNAPSHOT, digest


def test_every_recorded_plan_emits_the_recorded_source():
    recorded = json.loads(SNAPSHOT.read_text())
    assert len(recorded) >= 200
    programs = {}
    moved = []
    for cid, entry in recorded.items():
        example, model_name, arch, _ = cid.split(":")
        if example not in programs:
            programs[example] = load_program(ROOT / "examples" / example)
        model = programs[example].models[model_name]
        if digest(model, Plan.from_json(entry["plan"]), arch) != entry["sha256"]:
            moved.append(cid)
    assert not moved, f"{len(moved)} of {len(recorded)} plans emit other sources: {moved[:8]}"
