"""Absurd sizes (issue 23, item 5): refused with the extent and the limit before anything is proven
or allocated; and a time budget that holds inside a proof (a proof past it is abandoned)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from habu.db import PlanDB
from habu.errors import UsageError
from habu.prove.limits import CHECK_AXIS_MAX, size_problems
from habu.search.loop import Budget, Search
from habu.search.pool import InlineExecutor, ProcessExecutor
from habu.target import TARGETS
from tests.conftest import ROOT
from tests.search.test_search import model_of

ROWSUM_2_40 = """4 EXTENT: #R
1099511627776 EXTENT: #C

f32 TENSOR: X ( #R #C )
f32 TENSOR: Y ( #R )

MODEL: ROWSUM  Y[r] = Σ c X[r c] ;
"""


def gemm(tmp_path: Path, m: int, n: int, k: int) -> Path:
    text = (ROOT / "examples" / "gemm.habu").read_text()
    text = text.replace("8192 EXTENT: #M", f"{m} EXTENT: #M").replace("8192 EXTENT: #N", f"{n} EXTENT: #N")
    path = tmp_path / "gemm.habu"
    path.write_text(text.replace("8192 EXTENT: #K", f"{k} EXTENT: #K"))
    return path


def habu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "habu", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=60)


def one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    return line


def test_regression_a_2_40_reduction_is_refused_at_check_compile_and_search_not_a_numpy_traceback(tmp_path):
    # numpy was asked for 8 TiB (np.arange over #C in the finite-field check's box): a traceback
    path = tmp_path / "rowsum.habu"
    path.write_text(ROWSUM_2_40)
    for args in (("check", str(path)), ("compile", str(path), "-o", str(tmp_path / "out")),
                 ("search", str(path), "--budget", "10s", "--no-gpu", "--jobs", "1", "-o", str(tmp_path / "s"))):
        line = one_line_error(habu(*args))
        assert "#C = 1099511627776 (2^40)" in line and "16.0 TiB" in line and "device memory" in line, line
    assert not (tmp_path / "out").exists()


def test_regression_gemm_at_2_20_cubed_is_refused_at_once_not_proven_for_minutes(tmp_path):
    # compile ran past 300 s at 4 GB and search --budget 10s past 240 s
    path = gemm(tmp_path, 2**20, 2**20, 2**20)
    t0 = time.monotonic()
    for args in (("compile", str(path), "-o", str(tmp_path / "out")),
                 ("search", str(path), "--budget", "10s", "--no-gpu", "-o", str(tmp_path / "s"))):
        line = one_line_error(habu(*args))
        assert "tensor A (#M = 1048576 (2^20), #K = 1048576 (2^20))" in line and "2.0 TiB" in line, line
        assert "sm_90a's device memory (140.4 GiB)" in line, line
    assert time.monotonic() - t0 < 40


def test_size_limits_come_from_the_target_and_name_the_extent():
    model, sizes = model_of(ROOT / "examples" / "gemm.habu")
    sm_90a, sm_100a = TARGETS["sm_90a"], TARGETS["sm_100a"]
    assert size_problems(model, sizes, sm_90a) == []
    # A and B at 2^37 elements of bf16 (256 GiB each): more than the H200 and the B200 hold
    big = sizes | {"M": 2**22, "N": 2**22, "K": 2**15}
    a, b, c = size_problems(model, big, sm_90a)
    assert b.startswith("tensor B")
    assert a.startswith("tensor A (#M = 4194304 (2^22), #K = 32768 (2^15))") and "256.0 GiB" in a
    assert c.startswith("tensor C") and "32.0 TiB" in c
    # 96 GiB each fit one H200 but not the three together; a B200 (192 GB) holds them
    fits_one = sizes | {"M": 3 * 2**17, "N": 2**17, "K": 2**17}
    (together,) = size_problems(model, fits_one, sm_90a)
    assert together.startswith("the tensors of GEMM take") and "140.4 GiB" in together
    assert size_problems(model, {"M": 3 * 2**14, "N": 2**17, "K": 2**17}, sm_100a) == []


def test_a_reduction_longer_than_the_check_holds_is_refused(tmp_path):
    path = tmp_path / "rowsum.habu"
    path.write_text(ROWSUM_2_40.replace("4 EXTENT: #R", "1 EXTENT: #R"))
    model, _ = model_of(path)
    (why,) = size_problems(model, {"R": 1, "C": 2 * CHECK_AXIS_MAX}, TARGETS["sm_90a"])
    assert why.startswith("#C = 134217728 (2^27) is reduced over") and "at most 67108864 (2^26)" in why
    from habu.compile import compile_model
    from habu.spec.parser import load_program

    with pytest.raises(UsageError, match=r"#C = 134217728 \(2\^27\) is reduced over"):
        compile_model(load_program(path), "ROWSUM", {"C": 2 * CHECK_AXIS_MAX}, TARGETS["sm_90a"], {})


BIG_BIAS_GRAD = ("67108864 EXTENT: #R  64 EXTENT: #N  bf16 TENSOR: dY ( #R #N )  f32 TENSOR: G ( #N )\n"
                 "MODEL: BIAS-GRAD  G[n] = Σ r dY[r n] ;\n")


@pytest.mark.parametrize("executor", ["inline", "processes"])
def test_regression_the_time_budget_holds_inside_a_proof(tmp_path, monkeypatch, executor):
    # A 2 s budget ran on until a proof of minutes ended; the proof is now abandoned at the budget's end.
    # (The GEMM with K = 2^21 this test used first now proves in a second: its witness shrinks since
    # 64-bit plans no longer freeze tensors past 2^31 elements.) A column reduction over 2^26 rows: its
    # row splits are checked at full size, block by block, the deadline checked between blocks (it was
    # not: the proof ran past 120 s). Over 2^24 rows (session 40, a machine twice as fast as CI's) the
    # blocks all ran before the budget's end and the reference evaluation after them, which the deadline
    # does not interrupt: the proof was kept. Inline, the proof's clock jumps past the deadline once
    # the first block has run, so the block check is what abandons it on any machine; in the spawned
    # workers the blocks of 2^26 rows take ~4 s on the fastest machine seen (the budget ends among them); on
    # this sandbox (2026-12-04) they ended before it and the reference evaluation after: a pass found past the
    # deadline is now abandoned too (habu.prove.verify checks the deadline after the reference evaluation).
    path = tmp_path / "bias_grad_big.habu"
    path.write_text(BIG_BIAS_GRAD)
    model, sizes = model_of(path)
    if executor == "inline":
        import habu.prove.deadline as deadline_module
        import habu.prove.interp_columns as columns

        real_check, skew = columns.check_deadline, [0.0]

        class SkewedTime:
            @staticmethod
            def time() -> float:
                return time.time() + skew[0]

        def check_after_a_long_block(where: str = "") -> None:
            real_check(where)
            skew[0] = 3600.0  # the next block check sees the budget ended

        monkeypatch.setattr(deadline_module, "time", SkewedTime)
        monkeypatch.setattr(columns, "check_deadline", check_after_a_long_block)
    pool = InlineExecutor() if executor == "inline" else ProcessExecutor(2)
    t0 = time.monotonic()
    with PlanDB(tmp_path / "db.sqlite") as db:
        result = Search(str(path), model, TARGETS["sm_90a"], sizes, db, Budget(seconds=2), executor=pool).run()
        took = time.monotonic() - t0
        assert result.best is None and result.stats.abandoned >= 1 and result.stats.verified == 0, result.stats
        entry = db.get(result.key)
        assert entry is None or entry.failures == []  # an abandoned proof is not a failure of its plan
    assert took < 2 + 12, took
