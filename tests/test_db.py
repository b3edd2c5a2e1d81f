"""The plan database: keys that never cross GPUs or versions, top-k, sharing, and writers that
run at once or die mid-write."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sqlite3
import time

import pytest

from habu.db import Key, PlanDB, Record, Target, Versions, key_from_json
from habu.errors import HabuError


def key(gpu="NVIDIA H200", nvrtc="13.5", shape=(("M", 4096),), model_hash="h" * 64) -> Key:
    return Key(model_hash, "G", shape, (("A", "bf16"),), Target("sm_90a", gpu, 132), Versions("0.1.0", nvrtc, "13.0"))


def rec(t, name="p", status="measured") -> Record:
    return Record(0, {"model": name, "t": t}, status, median_us=t if status == "measured" else None, predicted_us=t)


def test_top_k_keeps_the_fastest_and_merges(tmp_path):
    with PlanDB(tmp_path / "db.sqlite") as db:
        db.store(key(), [rec(30, "a"), rec(10, "b")], keep=2)
        e = db.store(key(), [rec(20, "c"), rec(5, "d", status="unmeasured")], keep=2)
        assert [r.plan["model"] for r in e.records] == ["b", "c"]  # measured first, by median
        assert [r.rank for r in e.records] == [0, 1]


def test_lookup_never_returns_another_gpu_or_version(tmp_path):
    with PlanDB(tmp_path / "db.sqlite") as db:
        db.store(key(gpu="NVIDIA H100"), [rec(1)])
        db.store(key(nvrtc="12.9"), [rec(1)])
        exact, stale = db.lookup(key())
        assert exact is None and len(stale) == 2
        db.store(key(), [rec(2)])
        exact, stale = db.lookup(key())
        assert exact is not None and exact.records[0].median_us == 2 and len(stale) == 2
        other_shape, _ = db.lookup(key(shape=(("M", 1),)))
        assert other_shape is None


def test_export_import_remove(tmp_path):
    with PlanDB(tmp_path / "a.sqlite") as a:
        a.store(key(), [rec(3)])
        a.record_failure(key(), {"x": 1}, "compile failed: boom")
        assert a.export(tmp_path / "plans.json") == 1
    with PlanDB(tmp_path / "b.sqlite") as b:
        assert b.import_(tmp_path / "plans.json") == 1
        (e,) = b.entries()
        assert e.records[0].median_us == 3
        assert b.remove(e.digest[:8]) == 1 and b.entries() == []
        with pytest.raises(HabuError, match="not a Habu plan export"):
            (tmp_path / "junk.json").write_text("{}")
            b.import_(tmp_path / "junk.json")
    with PlanDB(tmp_path / "a.sqlite") as a:
        assert a.entries()[0].failures[0]["reason"] == "compile failed: boom"


def test_not_a_database(tmp_path):
    (tmp_path / "x.sqlite").write_text("this is not sqlite" * 100)
    with pytest.raises(HabuError, match="not a usable Habu plan database"):
        PlanDB(tmp_path / "x.sqlite")


def _writer(path: str, worker: int, n: int) -> None:
    with PlanDB(path) as db:
        for i in range(n):
            db.store(key(shape=(("M", worker % 3),)), [rec(float(worker * 100 + i), f"w{worker}-{i}")], keep=5)


def test_several_processes_write_at_once(tmp_path):
    path = str(tmp_path / "db.sqlite")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(path, w, 25)) for w in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    with PlanDB(path) as db:
        entries = db.entries()
        assert len(entries) == 3
        for e in entries:
            assert len(e.records) == 5
            times = [r.median_us for r in e.records]
            assert times == sorted(times)
        assert sqlite3.connect(path).execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _hold_a_write(path: str, ready) -> None:
    db = PlanDB(path)
    db.conn.execute("BEGIN IMMEDIATE")
    db.conn.execute("DELETE FROM plans")  # half a rewrite, never committed
    ready.set()
    time.sleep(60)


def test_a_writer_killed_mid_transaction_loses_nothing(tmp_path):
    path = str(tmp_path / "db.sqlite")
    with PlanDB(path) as db:
        db.store(key(), [rec(7)])
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_a_write, args=(path, ready))
    p.start()
    assert ready.wait(60)
    os.kill(p.pid, signal.SIGKILL)
    p.join(10)
    with PlanDB(path) as db:  # the database recovers and still has the committed plan
        (e,) = db.entries()
        assert e.records[0].median_us == 7
        db.store(key(), [rec(6)])
        assert db.get(key()).records[0].median_us == 6


def _open_at_once(path: str, go, out) -> None:
    go.wait(60)
    try:
        with PlanDB(path) as db:
            db.entries()
        out.put("ok")
    except Exception as exc:  # the failure is the answer
        out.put(str(exc))


def test_regression_many_processes_opening_a_new_database_at_once(tmp_path):
    """Processes racing to switch a new database to WAL and create its schema got "database is
    locked" at once, without the busy timeout (12 processes on a fresh file: 3 of 5 rounds lost
    one; CI lost a writer of test_several_processes_write_at_once this way)."""
    ctx = mp.get_context("spawn")
    for round_ in range(5):
        path = str(tmp_path / f"db{round_}.sqlite")
        go, out = ctx.Event(), ctx.Queue()
        procs = [ctx.Process(target=_open_at_once, args=(path, go, out)) for _ in range(12)]
        for p in procs:
            p.start()
        time.sleep(2.0)  # every process imported and waiting
        go.set()
        answers = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        assert answers == ["ok"] * 12, [a for a in answers if a != "ok"]


def test_regression_editing_only_key_json_does_not_make_a_lookup_use_the_entry(tmp_path):
    """An entry filed under one key whose stored key was edited to another is never returned."""
    import json
    from dataclasses import asdict

    with PlanDB(tmp_path / "db.sqlite") as db:
        db.store(key(gpu="NVIDIA H100"), [rec(1)])
        edited = asdict(key(gpu="NVIDIA H100"))
        edited["shape"] = [["M", 8192]]
        db.conn.execute("UPDATE entries SET key_json=?", (json.dumps(edited),))
        assert db.get(key(gpu="NVIDIA H100")) is None
        assert db.lookup(key(gpu="NVIDIA H100"))[0] is None


def test_regression_plans_ls_on_an_unrelated_sqlite_file_refuses_it_and_adds_no_tables(tmp_path):
    import hashlib
    import subprocess
    import sys

    other = tmp_path / "notes.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine')")
    conn.commit()
    conn.close()
    before = hashlib.sha256(other.read_bytes()).hexdigest()
    r = subprocess.run([sys.executable, "-m", "habu", "plans", "ls", "--db", str(other)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "error:" in r.stderr and "is not a Habu plan database" in r.stderr
    assert "Traceback" not in r.stderr
    assert hashlib.sha256(other.read_bytes()).hexdigest() == before
    tables = [t for (t,) in sqlite3.connect(other).execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert tables == ["notes"]
    with pytest.raises(HabuError, match="not a Habu plan database"):
        PlanDB(other)


def test_a_database_made_before_the_application_id_is_still_read(tmp_path):
    from habu.db import APPLICATION_ID, SCHEMA, SCHEMA_VERSION

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    conn.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
    conn.commit()
    conn.close()
    with PlanDB(path) as db:
        db.store(key(), [rec(1)])
        assert db.conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
    with PlanDB(path) as db:
        assert db.get(key()).records[0].median_us == 1


def test_an_import_is_one_transaction_a_bad_fourth_entry_commits_nothing(tmp_path):
    import json

    with PlanDB(tmp_path / "a.sqlite") as a:
        for m in range(4):
            a.store(key(shape=(("M", m + 1),)), [rec(m + 1)])
        a.export(tmp_path / "four.json")
    data = json.loads((tmp_path / "four.json").read_text())
    data["entries"][3]["records"][0]["median_us"] = -5  # schema: refused before anything is written
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with PlanDB(tmp_path / "b.sqlite") as b:
        with pytest.raises(HabuError, match=r"entries\[3\]\.records\[0\]\.median_us"):
            b.import_(tmp_path / "bad.json")
        assert b.entries() == []
        seen = []

        def refuse_the_fourth(k, r):  # a plan that fails its re-proof, after three that pass
            seen.append(k)
            if len(seen) == 4:
                raise HabuError("refused")

        with pytest.raises(HabuError, match="refused"):
            b.import_(tmp_path / "four.json", refuse_the_fourth)
        assert b.entries() == []
        assert b.import_(tmp_path / "four.json") == 4 and len(b.entries()) == 4


def test_regression_plans_ls_failed_whole_when_one_stored_row_was_bad(tmp_path, capsys, monkeypatch):
    """One corrupt record (or a plan with a field this Habu does not know) made `habu plans ls`
    fail for the whole database: now the good entries are listed and each bad one is a warning."""
    monkeypatch.delenv("COLUMNS", raising=False)  # xdist's workers have COLUMNS=80: ids cut to "…"
    from habu.cli_plans import plans_ls
    from habu.plan.plan import MapKernel, Plan

    plan = Plan("G", "h" * 64, "sm_90a", (), (MapKernel(nodes=("Y",), threads=256, vector=4),)).to_json()
    unknown = {**plan, "kernels": [{**plan["kernels"][0], "tile_order": 3}]}
    path = tmp_path / "db.sqlite"
    with PlanDB(path) as db:
        good = db.store(key(shape=(("M", 1),)), [Record(0, plan, "measured", median_us=7.5)])
        corrupt = db.store(key(shape=(("M", 2),)), [Record(0, plan, "measured", median_us=1.0)])
        odd = db.store(key(shape=(("M", 3),)), [Record(0, unknown, "measured", median_us=2.0)])
        with db.transaction() as c:
            c.execute("UPDATE plans SET record_json='{not json' WHERE digest=?", (corrupt.digest,))
        with pytest.raises(HabuError, match="unreadable"):
            db.entries()  # without a list for the problems, still an error
    plans_ls(db=path)
    out, err = capsys.readouterr()
    assert good.digest[:12] in out and "7.5 µs" in out
    assert corrupt.digest[:12] not in out and odd.digest[:12] not in out
    warnings = err.strip().splitlines()
    assert len(warnings) == 2, err
    assert any(w.startswith(f"warning: entry {corrupt.digest[:12]}: ") for w in warnings)
    assert any(w.startswith(f"warning: entry {odd.digest[:12]}: ") and "tile_order" in w for w in warnings)


def test_regression_equal_predictions_stored_the_old_default_first(tmp_path):
    """A CPU search stores the default plan first, then its finalists with the tie-break winner first.
    Predicted equal, the database kept the older record ahead, so `habu.load` used the default
    rather than the search's winner. Equal figures now keep the order just given."""
    with PlanDB(tmp_path / "db.sqlite") as db:
        db.store(key(), [rec(5.0, "default", "unmeasured")])
        entry = db.store(key(), [rec(5.0, "winner", "unmeasured"), rec(5.0, "default", "unmeasured")])
        assert [r.plan["model"] for r in entry.records] == ["winner", "default"]
        # a measured record still outranks any unmeasured one
        entry = db.store(key(), [rec(9.0, "timed"), rec(1.0, "late", "unmeasured")])
        assert entry.records[0].plan["model"] == "timed"


def test_regression_backward_entries_are_keyed_apart_and_forward_digests_do_not_change():
    import hashlib
    import json
    from dataclasses import asdict, replace

    fwd = key()
    legacy = asdict(fwd)
    legacy.pop("model")
    legacy.pop("direction")
    legacy.pop("ranges")  # (a size bucket's field: empty, left out too)
    assert fwd.digest() == hashlib.sha256(json.dumps(legacy, sort_keys=True).encode()).hexdigest()[:24]
    bwd = replace(fwd, direction="backward")
    assert bwd.digest() != fwd.digest() and bwd.same_problem() != fwd.same_problem()
    assert key_from_json(json.loads(json.dumps(asdict(bwd)))) == bwd
    old = asdict(fwd)
    old.pop("direction")  # a key stored before the field existed reads as forward
    assert key_from_json(old) == fwd
