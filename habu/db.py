"""The plan database: the best plans found for a model, a shape, a GPU and a toolchain.

SQLite in WAL mode (several processes may read while one writes; writers serialise on a
transaction). One *entry* per key:

    model hash · shape · size bucket (a runtime extent's lo..hi, habu/plan/buckets.py) · dtypes ·
    target arch · GPU name · SM count · Habu version · NVRTC version · driver version

Each entry keeps its top-k plans with their timing distribution (median, p20, p80, samples), the
finite-field certificate, the compiler's resource report and provenance (host, GPU, clocks, seed,
timestamp), plus the candidates that failed and why. A lookup only ever returns plans whose key
matches exactly; entries for the same model and shape made on another GPU or with other versions
are reported as stale, never used.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from habu.db_export import EXPORT_FORMAT
from habu.errors import HabuError
from habu.version import __version__

SCHEMA_VERSION = 1
APPLICATION_ID = 0x48616275  # "Habu": `PRAGMA application_id` of every plan database
OPEN_TIMEOUT_S = 60.0  # how long opening waits out other processes creating the same database


@dataclass(frozen=True)
class Target:
    """Where plans run: the architecture and the exact part."""

    arch: str
    gpu: str  # e.g. "NVIDIA H200", or "none" for a search without a GPU
    sm_count: int


@dataclass(frozen=True)
class Versions:
    habu: str
    nvrtc: str
    driver: str


@dataclass(frozen=True)
class Key:
    model_hash: str
    model: str  # the model's name (for listings; the hash is what matches)
    shape: tuple[tuple[str, int], ...]
    dtypes: tuple[tuple[str, str], ...]
    target: Target
    versions: Versions
    # "forward", or "backward": the plans of a model's derived backward model (habu.spec.grad). A forward
    # key's digest leaves it out, so the digests of entries stored before it existed do not change.
    direction: str = "forward"
    # a size bucket's entry (habu/plan/buckets.py): each bucketed runtime extent's lo..hi, that extent
    # left out of `shape`; empty for an entry of one shape (digests of such keys are as before buckets)
    ranges: tuple[tuple[str, int, int], ...] = ()

    def _identity(self) -> dict:
        d = asdict(self)
        d.pop("model")
        if self.direction == "forward":
            d.pop("direction")
        if not self.ranges:
            d.pop("ranges")
        return d

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self._identity(), sort_keys=True).encode()).hexdigest()[:24]

    def same_problem(self) -> str:
        """What identifies the computation regardless of GPU and versions (for stale reports)."""
        problem = [self.model_hash, self.shape, self.dtypes] + ([self.direction] if self.direction != "forward" else [])
        problem += [self.ranges] if self.ranges else []
        return hashlib.sha256(json.dumps(problem, sort_keys=True).encode()).hexdigest()[:24]


@dataclass
class Record:
    """One stored plan."""

    rank: int
    plan: dict
    status: str  # "measured" or "unmeasured" (ranked by the cost model only)
    median_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    samples_us: list[float] = field(default_factory=list)
    predicted_us: float | None = None
    certificate: dict | None = None
    resources: dict | None = None
    golden: dict | None = None
    provenance: dict = field(default_factory=dict)


@dataclass
class Entry:
    key: Key
    digest: str
    created: float
    updated: float
    records: list[Record]
    failures: list[dict]


def default_path() -> Path:
    env = os.environ.get("HABU_DB")
    if env:
        return Path(env)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "habu" / "plans.sqlite"


def provenance(seed: int | None = None, **extra: Any) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "seed": seed, "time": time.time(),
            "habu": __version__, **extra}


SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS entries (
    digest TEXT PRIMARY KEY,
    problem TEXT NOT NULL,
    key_json TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_problem ON entries(problem);
CREATE TABLE IF NOT EXISTS plans (
    digest TEXT NOT NULL REFERENCES entries(digest) ON DELETE CASCADE,
    rank INTEGER NOT NULL,
    record_json TEXT NOT NULL,
    PRIMARY KEY (digest, rank)
);
CREATE TABLE IF NOT EXISTS failures (
    digest TEXT NOT NULL REFERENCES entries(digest) ON DELETE CASCADE,
    plan_key TEXT NOT NULL,
    reason TEXT NOT NULL,
    at REAL NOT NULL
);
"""


class PlanDB:
    """A handle on one database file; cheap to open, safe to use from several processes."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Processes opening a new database at once race to switch it to WAL and create the
        # schema; SQLite answers some of them "database is locked" at once, without waiting on the
        # busy timeout (12 processes on a fresh file: 3 of 5 rounds lost one). They try again.
        deadline = time.monotonic() + OPEN_TIMEOUT_S
        while True:
            try:
                self.conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
                self._prepare()
                break
            except sqlite3.OperationalError as exc:
                with contextlib.suppress(Exception):
                    self.conn.close()
                if ("locked" not in str(exc) and "busy" not in str(exc)) or time.monotonic() > deadline:
                    raise HabuError(f"{self.path} is not a usable Habu plan database: {exc}") from None
                time.sleep(random.uniform(0.01, 0.1))
            except sqlite3.DatabaseError as exc:
                with contextlib.suppress(Exception):
                    self.conn.close()
                raise HabuError(f"{self.path} is not a usable Habu plan database: {exc}") from None
            except HabuError:
                with contextlib.suppress(Exception):
                    self.conn.close()
                raise
        version = self.conn.execute("SELECT value FROM meta WHERE name='schema'").fetchone()[0]
        if int(version) != SCHEMA_VERSION:
            raise HabuError(f"{self.path} has plan-database schema {version}; this Habu reads {SCHEMA_VERSION}")

    def _prepare(self) -> None:
        self.conn.execute("PRAGMA busy_timeout=30000")
        if not self._is_plan_database():  # checked before anything is written to the file
            raise HabuError(f"{self.path} is not a Habu plan database (it is another SQLite file; "
                            "give habu a new file or its own database with --db or $HABU_DB)")
        if self.conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        if self.conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID:
            return
        # a new file (or one from before the application id): created at once, in one transaction
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            if not self._is_plan_database():  # another process made it something else meanwhile
                raise HabuError(f"{self.path} is not a Habu plan database")
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    self.conn.execute(statement)
            self.conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            self.conn.execute(f"PRAGMA application_id={APPLICATION_ID}")
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def _is_plan_database(self) -> bool:
        """A Habu plan database (by its application id, or its meta table for one made before the id
        was set) or an empty file; never an unrelated SQLite file that Habu would add tables to."""
        app = self.conn.execute("PRAGMA application_id").fetchone()[0]
        if app == APPLICATION_ID:
            return True
        if app != 0:
            return False
        tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if not tables:
            return True
        if not {"meta", "entries", "plans", "failures"} <= tables:
            return False
        return self.conn.execute("SELECT 1 FROM meta WHERE name='schema'").fetchone() is not None

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> PlanDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE: one writer at a time; a crash mid-write leaves the last commit intact."""
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    # -- writing
    def store(self, key: Key, records: list[Record], keep: int = 5) -> Entry:
        """Merge `records` into the key's top-k (by median time, then predicted time), atomically."""
        with self.transaction() as c:
            _merge(c, key, records, keep)
        # the records only: a search stores at every new best, and reading an entry's failure
        # records each time cost 190 ms a store at 50,000 of them (issue 23)
        entry = self.get(key, failures=False)
        assert entry is not None
        return entry

    def record_failure(self, key: Key, plan: dict, reason: str) -> None:
        digest = key.digest()
        now = time.time()
        with self.transaction() as c:
            if c.execute("SELECT 1 FROM entries WHERE digest=?", (digest,)).fetchone() is None:
                c.execute("INSERT INTO entries VALUES (?, ?, ?, ?, ?)",
                          (digest, key.same_problem(), json.dumps(asdict(key)), now, now))
            c.execute("INSERT INTO failures VALUES (?, ?, ?, ?)", (digest, plan_key(plan), reason[:2000], now))

    def remove(self, digest_prefix: str) -> int:
        with self.transaction() as c:
            rows = c.execute("SELECT digest FROM entries WHERE digest LIKE ?", (digest_prefix + "%",)).fetchall()
            for (d,) in rows:
                c.execute("DELETE FROM entries WHERE digest=?", (d,))
        return len(rows)

    # -- reading
    def get(self, key: Key, failures: bool = True) -> Entry | None:
        """The entry stored under exactly this key. An entry whose stored key is not the key asked
        for (its row edited, or a digest collision) is never returned. `failures=False`: its
        failure records are not read (the entry's `failures` is empty)."""
        entry = self._entry(key.digest(), failures)
        if entry is None or entry.key.digest() != key.digest() or entry.key != replace(key, model=entry.key.model):
            return None
        return entry

    def _entry(self, digest: str, with_failures: bool = True) -> Entry | None:
        row = self.conn.execute("SELECT key_json, created, updated FROM entries WHERE digest=?", (digest,)).fetchone()
        if row is None:
            return None
        failures = [{"plan": p, "reason": r, "at": a} for p, r, a in
                    self.conn.execute("SELECT plan_key, reason, at FROM failures WHERE digest=? ORDER BY at",
                                      (digest,))] if with_failures else []
        try:
            key = key_from_json(json.loads(row[0]))
            records = [Record(**json.loads(r[0])) for r in
                       self.conn.execute("SELECT record_json FROM plans WHERE digest=? ORDER BY rank", (digest,))]
        except (ValueError, KeyError, TypeError) as exc:
            raise HabuError(f"entry {digest[:12]} of {self.path} is unreadable ({exc}); "
                            "remove it with habu plans rm") from None
        return Entry(key, digest, row[1], row[2], records, failures)

    def lookup(self, key: Key) -> tuple[Entry | None, list[Entry]]:
        """The entry for exactly this key, and the stale ones (same problem, other GPU or versions)."""
        exact = self.get(key)
        stale = [e for e in self.entries() if e.key.same_problem() == key.same_problem() and e.digest != key.digest()]
        return exact, stale

    def entries(self, problems: list[str] | None = None) -> list[Entry]:
        """Every entry, most recently updated first. An unreadable one (corrupt JSON, an unknown field)
        raises a HabuError, or with `problems` is left out and said there ("entry ID: why")."""
        digests = [r[0] for r in self.conn.execute("SELECT digest FROM entries ORDER BY updated DESC")]
        out = []
        for d in digests:
            try:
                entry = self._entry(d)
            except HabuError as err:
                if problems is None:
                    raise
                problems.append(f"entry {d[:12]}: {err.message}")
                continue
            if entry is not None:
                out.append(entry)
        return out

    def find(self, digest_prefix: str) -> Entry:
        rows = self.conn.execute("SELECT digest FROM entries WHERE digest LIKE ?", (digest_prefix + "%",)).fetchall()
        if not rows:
            raise HabuError(f"no entry {digest_prefix!r} in {self.path}")
        if len(rows) > 1:
            raise HabuError(f"{digest_prefix!r} matches {len(rows)} entries; give more of the id")
        entry = self._entry(rows[0][0])
        assert entry is not None
        return entry

    # -- sharing
    def export(self, path: Path, digests: list[str] | None = None) -> int:
        entries = [e for e in self.entries() if not digests or any(e.digest.startswith(d) for d in digests)]
        data = {"habu_plans": EXPORT_FORMAT, "exported": time.time(),
                "entries": [{"key": asdict(e.key), "created": e.created, "updated": e.updated,
                             "records": [asdict(r) for r in e.records], "failures": e.failures} for e in entries]}
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        os.replace(tmp, path)
        return len(entries)

    def import_(self, path: Path, check: Callable[[Key, Record], None] | None = None, keep: int = 5) -> int:
        """Merge an export into the database, all of it or nothing: the file is checked against
        the export schema, every key and record is read and passed to `check` (which raises to
        refuse it: the CLI proves each plan again), and only then is it written, in one transaction."""
        from habu.db_export import parse_export

        data = parse_export(path)
        entries: list[tuple[Key, list[Record]]] = []
        for i, e in enumerate(data["entries"]):
            try:
                key = key_from_json(e["key"])
                records = [Record(**r) for r in e["records"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise HabuError(f"{path}: entry {i} is not a Habu plan entry: {exc}") from None
            for r in records:
                if check is not None:
                    check(key, r)
            entries.append((key, records))
        with self.transaction() as c:
            for key, records in entries:
                _merge(c, key, records, keep)
        return len(entries)


def _merge(c: sqlite3.Connection, key: Key, records: list[Record], keep: int) -> None:
    """Merge `records` into the key's top-k (by median time, then predicted time), in the caller's
    transaction. The entry's stored key is written again: it is the key it is filed under."""
    digest = key.digest()
    now = time.time()
    row = c.execute("SELECT created FROM entries WHERE digest=?", (digest,)).fetchone()
    old = [Record(**json.loads(r[0])) for r in
           c.execute("SELECT record_json FROM plans WHERE digest=? ORDER BY rank", (digest,))]
    merged: dict[str, Record] = {}
    for r in old + records:
        pk = plan_key(r.plan)
        if pk not in merged or not _better(merged[pk], r):  # the later of equal records
            merged[pk] = r
    # equal figures (unmeasured plans the cost model predicts equal) keep the order of the records just
    # given, ahead of older ones: the search orders its finalists by finer terms the records do not hold
    given = {id(r): i for i, r in enumerate(records)}
    best = sorted(merged.values(), key=lambda r: (_order(r), given.get(id(r), len(records))))[:keep]
    for i, r in enumerate(best):
        r.rank = i
    if row is None:
        c.execute("INSERT INTO entries VALUES (?, ?, ?, ?, ?)",
                  (digest, key.same_problem(), json.dumps(asdict(key)), now, now))
    else:
        c.execute("UPDATE entries SET updated=?, key_json=?, problem=? WHERE digest=?",
                  (now, json.dumps(asdict(key)), key.same_problem(), digest))
    c.execute("DELETE FROM plans WHERE digest=?", (digest,))
    c.executemany("INSERT INTO plans VALUES (?, ?, ?)", [(digest, r.rank, json.dumps(asdict(r))) for r in best])


def key_from_json(d: Mapping[str, Any]) -> Key:
    return Key(d["model_hash"], d["model"], tuple(tuple(x) for x in d["shape"]),  # type: ignore[misc]
               tuple(tuple(x) for x in d["dtypes"]), Target(**d["target"]), Versions(**d["versions"]),  # type: ignore[misc]
               direction=d.get("direction", "forward"),
               ranges=tuple((str(r[0]), int(r[1]), int(r[2])) for r in d.get("ranges", ())))


def plan_key(plan: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()[:16]


def _order(r: Record) -> tuple:
    measured = r.status == "measured" and r.median_us is not None
    return (0 if measured else 1, r.median_us if measured else (r.predicted_us or float("inf")))


def _better(a: Record, b: Record) -> bool:
    return _order(a) < _order(b)
