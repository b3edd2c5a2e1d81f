"""The plan database from the user's side: habu plans ls/show/rm/export/import, and habu.load."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

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
    return subprocess.run([sys.executable, "-m", "habu", *args, "--db", str(db)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)


def searched(db_path) -> Plan:
    """Search GGEMM at SHAPE on this machine (no GPU: cost-model ranking) into db_path."""
    model = next(iter(load_program(GGEMM).models.values())).with_sizes(SHAPE)
    with PlanDB(db_path) as db:
        result = Search(str(GGEMM), model, TARGETS["sm_90a"], SHAPE, db, Budget(trials=2)).run()
    return result.best


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
