"""Emitted sources stay byte-identical across refactors: every recorded plan (each example's default
and a seeded sample of legal plans, tests/data/emitted_sources.json) is emitted again from its stored
JSON and hashed. A change on purpose re-records them (`python -m tests.emit_cuda.emitted_snapshot
--write`) and says why in its commit."""

from __future__ import annotations

import json

from tests.emit_cuda.emitted_snapshot import SNAPSHOT, digest, recorded_plans


def test_every_recorded_plan_emits_the_recorded_source():
    recorded = json.loads(SNAPSHOT.read_text())
    assert len(recorded) >= 200
    moved = [cid for cid, model, plan, arch in recorded_plans() if digest(model, plan, arch) != recorded[cid]["sha256"]]
    assert not moved, f"{len(moved)} of {len(recorded)} plans emit other sources: {moved[:8]}"
