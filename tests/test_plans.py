"""The plan database from the user's side: habu plans ls/show/rm/export/import, and habu.load."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import habu
from habu.api import _warned, lookup_key
from habu.db import PlanDB
from habu.plan.plan import Plan
from habu.search.loop import Budget, Search
from habu.spec.parser import load_program
from habu.target import TARGETS
from tests.conftest import ROOT

GGEMM = ROOT / "examples" / "ggemm.habu"
SHAPE = {"M": 512, "N": 512, "K": 256}


def habu_cli(*args: str, db) -> subprocess.CompletedProcess:
    # wide enough for every column of plans ls on one line (pytest sets COLUMNS=80)
    return subprocess.run([sys.executable, "-m", "habu", *args, "--db", str(db)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300, env={**os.environ, "COLUMNS": "320"})


_SEARCHED: dict[str, object] = {}  # the one search of this module: its database file and best plan


def searched(db_path) -> Plan:
    """GGEMM searched at SHAPE on this machine (no GPU: cost-model ranking) into db_path: the search runs
    once per test process, and each test gets its own copy of the database it wrote."""
    if not _SEARCHED:
        template = Path(tempfile.mkdtemp(prefix="habu-plans-")) / "searched.sqlite"
        model = next(iter(load_program(GGEMM).models.values())).with_sizes(SHAPE)
        with PlanDB(template) as db:
            result = Search(str(GGEMM), model, TARGETS["sm_90a"], SHAPE, db, Budget(trials=2)).run()
        _SEARCHED.update(db=template, best=result.best)
    with sqlite3.connect(_SEARCHED["db"]) as src, sqlite3.connect(db_path) as dst:
        src.backup(dst)  # a consistent copy, write-ahead log included
    return _SEARCHED["best"]


def test_plans_ls_show_export_rm_import(tmp_path):
    db = tmp_path / "plans.sqlite"
    best = searched(db)
    with PlanDB(db) as plans:
        (entry,) = plans.entries()
    r = habu_cli("plans", "ls", db=db)
    assert r.returncode == 0 and entry.digest[:12] in r.stdout and "GGEMM" in r.stdout
    r = habu_cli("plans", "show", entry.digest[:10], db=db)
    shown = json.loads(r.stdout)
    assert shown["records"][0]["plan"] == best.to_json() and shown["key"]["model"] == "GGEMM"
    export = tmp_path / "team.json"
    assert "exported 1" in habu_cli("plans", "export", str(export), db=db).stdout
    assert "removed 1 entry" in habu_cli("plans", "rm", entry.digest[:10], db=db).stdout
    r = habu_cli("plans", "show", entry.digest[:10], db=db)
    assert r.returncode != 0 and "no entry" in r.stderr and "Traceback" not in r.stderr
    assert "imported 1" in habu_cli("plans", "import", str(export), db=db).stdout
    with PlanDB(db) as plans:
        assert plans.find(entry.digest).records[0].plan == best.to_json()


def test_import_of_a_file_that_is_not_an_export_is_refused_plainly(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text("{not json")
    r = habu_cli("plans", "import", str(bad), db=tmp_path / "db.sqlite")
    assert r.returncode != 0 and "not a Habu plan export" in r.stderr and "Traceback" not in r.stderr


def kernel_names(compiled) -> list[str]:
    return [k.name for _, p in compiled.kernel_set.members for k in p.kernels]


def test_load_uses_the_plan_stored_for_this_machine(tmp_path, capsys):
    db = tmp_path / "plans.sqlite"
    best = searched(db)
    compiled = habu.load(GGEMM, model="GGEMM", db=db, **SHAPE)
    assert all(best.key[:8] in name for name in kernel_names(compiled))
    assert "warning" not in capsys.readouterr().err


def test_load_on_a_miss_warns_once_and_uses_the_default_plan(tmp_path, capsys):
    _warned.clear()
    db = tmp_path / "empty.sqlite"
    for _ in range(2):
        habu.load(GGEMM, model="GGEMM", db=db, **SHAPE)
    err = capsys.readouterr().err
    assert err.count("no tuned plan for GGEMM") == 1 and "habu search" in err


def test_load_never_uses_a_plan_made_for_another_gpu(tmp_path, capsys):
    _warned.clear()
    db = tmp_path / "plans.sqlite"
    searched(db)
    with PlanDB(db) as plans:
        (entry,) = plans.entries()
        other = replace(entry.key, target=replace(entry.key.target, gpu="NVIDIA B200", sm_count=148))
        plans.remove(entry.digest)
        plans.store(other, entry.records)
        model = next(iter(load_program(GGEMM).models.values())).with_sizes(SHAPE)
        assert plans.lookup(lookup_key(model, TARGETS["sm_90a"]))[0] is None
    habu.load(GGEMM, model="GGEMM", db=db, **SHAPE)
    err = capsys.readouterr().err
    assert "no tuned plan" in err and "1 entries for other GPUs or versions exist, not used" in err


def test_regression_load_refuses_a_stored_plan_with_32_bit_offsets_at_600000_rows(tmp_path):
    """A plan habu verify rejects, filed under this machine's key (as an import used to file it):
    habu.load (and habu run, which calls it) proves it again and refuses it before compiling."""
    import pytest

    from habu.prove.trust import PlanRefused
    from tests.test_plan_import import ggemm_entry

    sizes = {"M": 600000, "N": 512, "K": 4096}
    _, records = ggemm_entry(sizes, wide_offsets=False)
    model = next(iter(load_program(GGEMM).models.values())).with_sizes(sizes)
    db = tmp_path / "plans.sqlite"
    with PlanDB(db) as plans:
        plans.store(lookup_key(model, TARGETS["sm_90a"]), records)
    with pytest.raises(PlanRefused, match=r"breaks rule int32-offsets in kernel \d"):
        habu.load(GGEMM, model="GGEMM", db=db, **sizes)


def test_regression_load_ignores_an_entry_whose_key_json_was_edited(tmp_path, capsys):
    _warned.clear()
    db = tmp_path / "plans.sqlite"
    searched(db)
    with PlanDB(db) as plans:
        assert len(plans.entries()) == 1
        edited = json.loads(plans.conn.execute("SELECT key_json FROM entries").fetchone()[0])
        edited["dtypes"] = [[name, "f32"] for name, _ in edited["dtypes"]]
        plans.conn.execute("UPDATE entries SET key_json=?", (json.dumps(edited),))
    habu.load(GGEMM, model="GGEMM", db=db, **SHAPE)
    assert "no tuned plan for GGEMM" in capsys.readouterr().err
    r = habu_cli("plans", "ls", db=db)
    assert r.returncode == 0 and "CORRUPT" in r.stdout


def test_load_refuses_a_stored_plan_whose_certificate_is_another_plans(tmp_path):
    import pytest

    from habu.prove.trust import PlanRefused

    db = tmp_path / "plans.sqlite"
    searched(db)
    with PlanDB(db) as plans:
        digest, rank, text = plans.conn.execute("SELECT digest, rank, record_json FROM plans WHERE rank=0").fetchone()
        record = json.loads(text)
        record["certificate"]["plan_key"] = "0" * 16
        plans.conn.execute("UPDATE plans SET record_json=? WHERE digest=? AND rank=?",
                           (json.dumps(record), digest, rank))
    with pytest.raises(PlanRefused, match="proves nothing about this plan"):
        habu.load(GGEMM, model="GGEMM", db=db, **SHAPE)


def test_load_proves_a_stored_plan_again_once_per_process(tmp_path, monkeypatch):
    from habu.prove import trust

    db = tmp_path / "plans.sqlite"
    best = searched(db)
    proofs = []
    real = trust.prove
    monkeypatch.setattr(trust, "prove", lambda *a, **k: proofs.append(k.get("trials")) or real(*a, **k))
    trust._REPROVEN.clear()
    for _ in range(2):
        compiled = habu.load(GGEMM, model="GGEMM", db=db, **SHAPE)
        assert all(best.key[:8] in name for name in kernel_names(compiled))
    assert proofs == [1]  # the rules and one finite-field trial, once


def test_plans_ls_marks_stale_entries_and_shows_versions(tmp_path):
    db = tmp_path / "plans.sqlite"
    searched(db)
    with PlanDB(db) as plans:
        (entry,) = plans.entries()
        other = replace(entry.key, target=replace(entry.key.target, gpu="NVIDIA B200", sm_count=148),
                        versions=replace(entry.key.versions, driver="999.1"))
        plans.store(other, entry.records)
    r = habu_cli("plans", "ls", db=db)
    assert r.returncode == 0
    rows = {line.split()[1]: line for line in r.stdout.splitlines() if "GGEMM" in line}
    assert rows[other.digest()[:12]].count("STALE: gpu NVIDIA B200, sm_count 148, driver 999.1") == 1
    assert "current" in rows[entry.digest[:12]] and entry.key.versions.nvrtc in rows[entry.digest[:12]]
