"""Speed under load (issue 23, item 7): proofs in the search process run with one BLAS thread, and
storing a new best does not re-read the entry's failure records."""

from __future__ import annotations

import json
import time
from dataclasses import asdict

import numpy as np
import pytest

from habu.db import Key, PlanDB, Record, Target, Versions
from habu.search.pool import InlineExecutor
from habu.search.tasks import Job
from habu.search.threads import BlasThreads


def test_regression_proofs_in_the_search_process_run_with_one_blas_thread():
    probe = BlasThreads.__new__(BlasThreads)  # only to read the count, changing nothing
    before = probe.threads()
    if before is None:
        pytest.skip("numpy here does not use OpenBLAS")
    np.ones((64, 64)) @ np.ones((64, 64))
    executor = InlineExecutor()
    executor.submit(Job("", "x.habu", "M", (), "sm_90a"), [])  # the first batch sets the limit
    try:
        assert probe.threads() == 1 and executor.blas is not None and executor.blas.how != "none"
    finally:
        executor.close()
    assert probe.threads() == before  # given back as it was when the search ends


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_storing_a_new_best_does_not_reread_the_failure_records(tmp_path):
    # 50,000 failure records cost 190 ms a store: every store re-read them all
    key = Key("h" * 64, "G", (("M", 4096),), (("A", "bf16"),), Target("sm_90a", "NVIDIA H200", 132),
              Versions("0.1.0", "13.5", "13.0"))
    with PlanDB(tmp_path / "db.sqlite") as db:
        with db.transaction() as c:
            c.execute("INSERT INTO entries VALUES (?, ?, ?, ?, ?)",
                      (key.digest(), key.same_problem(), json.dumps(asdict(key)), 0.0, 0.0))
            c.executemany("INSERT INTO failures VALUES (?, ?, ?, ?)",
                          [(key.digest(), f"plan{i}", "rules", float(i)) for i in range(50_000)])
        queries: list[str] = []
        db.conn.set_trace_callback(queries.append)
        t0 = time.perf_counter()
        for t in range(20):
            entry = db.store(key, [Record(0, {"model": "p", "t": t}, "unmeasured", predicted_us=100.0 - t)])
        took = (time.perf_counter() - t0) / 20
        db.conn.set_trace_callback(None)
        assert entry.records[0].plan["t"] == 19
        assert not [q for q in queries if "FROM failures" in q]
        assert took < 0.05, took
        assert len(db.get(key).failures) == 50_000  # still there for whoever asks
