"""The command line's outputs and argument checks: -o paths checked before any work, results on stdout
and progress on stderr, bad --budget/--shape/--pin values, refusals that name the limit."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from habu.errors import HabuError
from tests.conftest import ROOT


def habu(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "habu", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, env=env)


def refused_fast(r: subprocess.CompletedProcess, started: float, *needles: str) -> None:
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr
    assert time.time() - started < 30, "the path was checked after the work"


@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "FILE"
    f.write_text("not a directory")
    return f


def test_regression_compile_o_file_fails_before_proving(a_file):
    t = time.time()
    refused_fast(habu("compile", "examples/ggemm.habu", "-o", str(a_file)), t, "is a file")


def test_regression_emit_o_dir_fails_before_proving(tmp_path):
    t = time.time()
    refused_fast(habu("emit", "examples/ggemm.habu", "-o", str(tmp_path)), t, "is a directory")


def test_regression_eval_o_inside_a_file_fails_before_evaluating(a_file, tmp_path):
    np.savez(tmp_path / "in.npz", X=np.ones((4, 4)))
    t = time.time()
    r = habu("eval", "examples/softmax.habu", "--inputs", str(tmp_path / "in.npz"), "-o", str(a_file / "x.npz"),
             "--shape", "R=4,C=4")
    refused_fast(r, t, f"{a_file} is a file, not a directory")
    assert not (tmp_path / "x.npz").exists()


def test_regression_search_o_inside_a_file_fails_before_searching(a_file, tmp_path):
    t = time.time()
    r = habu("search", "examples/ggemm.habu", "--no-gpu", "--budget", "1", "--shape", "M=512,N=512,K=512",
             "--db", str(tmp_path / "db.sqlite"), "-o", str(a_file / "sub"))
    refused_fast(r, t, "is a file, not a directory")
    assert not (tmp_path / "db.sqlite").exists()


def test_regression_plans_export_into_a_file_fails_first(a_file, tmp_path):
    r = habu("plans", "export", str(a_file / "e.json"), "--db", str(tmp_path / "db.sqlite"))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "is a file, not a directory" in r.stderr


def test_regression_plans_ls_does_not_create_directories(tmp_path):
    db = tmp_path / "no" / "dir" / "x.db"
    r = habu("plans", "ls", "--db", str(db))
    assert r.returncode == 0 and "no plan database" in r.stderr
    assert not (tmp_path / "no").exists()
    for cmd in (("show", "abc"), ("rm", "abc"), ("export", str(tmp_path / "e.json"))):
        r = habu("plans", *cmd, "--db", str(db))
        assert r.returncode == 1 and "no plan database" in r.stderr and "Traceback" not in r.stderr, cmd
        assert not (tmp_path / "no").exists()


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_search_budget_zero_is_an_error(tmp_path):
    for budget in ("0", "0s"):
        r = habu("search", "examples/ggemm.habu", "--no-gpu", "--budget", budget, "--shape", "M=512,N=512,K=512",
                 "--db", str(tmp_path / "db.sqlite"), "-o", str(tmp_path / "out"))
        assert r.returncode == 1 and "positive budget" in r.stderr and "Traceback" not in r.stderr, budget


def test_regression_duplicate_shape_keys_are_an_error(tmp_path):
    r = habu("compile", "examples/ggemm.habu", "--shape", "K=512,K=256", "-o", str(tmp_path))
    assert r.returncode == 1 and "gives #K twice" in r.stderr


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_pin_errors_list_the_allowed_values(tmp_path):
    r = habu("compile", "examples/ggemm.habu", "--pin", "stages=0", "-o", str(tmp_path))
    assert r.returncode == 1 and "expected one of \n" not in r.stderr and "expected one of  " not in r.stderr
    assert "≥ 1" in r.stderr, r.stderr
    r = habu("compile", "examples/ggemm.habu", "--pin", "mma=foo", "-o", str(tmp_path))
    assert r.returncode == 1 and "expected one of fma, mma.sync, wgmma" in r.stderr


def test_regression_build_with_an_unknown_extent_names_the_extents():
    from habu.api import build

    with pytest.raises(HabuError) as info:
        build(ROOT / "examples" / "ggemm.habu", Q=5, check=False)
    assert "no extent #Q" in info.value.message and "#M, #N, #K" in info.value.message


def test_regression_eval_shape_sets_a_static_extent_as_the_readme_says(tmp_path):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 511)), rng.standard_normal((5, 511))
    ix = rng.integers(0, 6, size=6).astype(np.int32)
    np.savez(tmp_path / "in.npz", A=a, B=b, IX=ix)
    r = habu("eval", "examples/ggemm.habu", "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz"),
             "--shape", "M=6,N=5,K=511")
    assert r.returncode == 0, r.stderr
    with np.load(tmp_path / "o.npz") as out:
        np.testing.assert_allclose(out["O"], a[ix] @ b.T, rtol=1e-12)


def test_refusal_names_the_limit_and_suggests_pin_only_with_pin(tmp_path):
    r = habu("compile", "examples/ggemm.habu", "--pin", "tile=128x256x64", "--pin", "stages=8", "-o", str(tmp_path),
             "--trials", "1")
    assert r.returncode == 1 and "breaks rule smem-budget" in r.stderr
    assert "bytes of shared memory; the target has 232448" in r.stderr and "--pin" in r.stderr
    from habu.api import build

    with pytest.raises(HabuError) as info:
        build(ROOT / "examples" / "ggemm.habu", pins={"tile": "128x256x64", "stages": "8"}, check=False)
    assert "the target has 232448" in info.value.message
    assert not any("--pin" in n for n in info.value.notes) and any("pins=" in n for n in info.value.notes)


def test_search_writes_results_to_stdout_and_progress_to_stderr(tmp_path):
    env = dict(os.environ, HABU_DB=str(tmp_path / "db.sqlite"))
    r = habu("search", "examples/ggemm.habu", "--no-gpu", "--budget", "2", "--jobs", "1", "--shape",
             "M=512,N=512,K=256", "-o", str(tmp_path / "out"), env=env, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "winner: plan" in r.stdout and "wrote " in r.stdout
    assert "winner: plan" not in r.stderr
    assert "no roofline.png: nothing was timed" in r.stderr
    assert not (tmp_path / "out" / "roofline.png").exists()


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_verify_refusal_does_not_suggest_pin_it_has_not(tmp_path):
    import json

    r = habu("compile", "examples/ggemm.habu", "--shape", "K=512", "-o", str(tmp_path), "--trials", "1")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "plan.json").read_text())
    data["kernels"][0]["a_move"] = "tma"  # TMA cannot gather A's rows on sm_90a
    (tmp_path / "bad.json").write_text(json.dumps(data))
    r = habu("verify", "examples/ggemm.habu", "--plan", str(tmp_path / "bad.json"))
    assert r.returncode == 1 and "tma-gather" in r.stderr and "--pin" not in r.stderr


def test_regression_an_existing_output_file_is_overwritten(tmp_path):
    from habu.cli_paths import output_dir, output_file

    (tmp_path / "y.npz").write_bytes(b"old")
    output_file(tmp_path / "y.npz", "-o")  # no error: it is replaced
    output_file(tmp_path / "new" / "deeper" / "y.npz", "-o")
    output_dir(tmp_path / "new" / "dir", "-o")
    assert not (tmp_path / "new").exists()  # the checks create nothing


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_a_repeated_shape_option_keeps_every_size(tmp_path):
    """`--shape M=300 --shape N=200,K=511` kept only the last option's sizes (typer's single value)."""
    import json

    from habu.cli_options import parse_shape

    assert parse_shape(["M=300", "N=200,K=511"], ["M", "N", "K"]) == {"M": 300, "N": 200, "K": 511}
    r = habu("compile", "examples/gemm.habu", "--shape", "M=300", "--shape", "N=200,K=511", "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    shape = json.loads((tmp_path / "plan.json").read_text())["shape"]
    assert {k: shape[k] for k in ("M", "N", "K")} == {"M": 300, "N": 200, "K": 511}, shape
    r = habu("compile", "examples/gemm.habu", "--shape", "K=512", "--shape", "K=256", "-o", str(tmp_path))
    assert r.returncode == 1 and "gives #K twice" in r.stderr, r.stderr


def test_regression_the_report_of_a_window_over_a_runtime_extent_names_it(tmp_path):
    """A causal attention over a runtime query count (`1..64 EXTENT: #I`): its unfused plan's value product skips
    the zero k tiles, and the report counted the share of k steps at the sizes it had, #I's None among them (a
    TypeError after the proof; session 68's fuzz, most of `random_attention`'s seeds with #I a runtime extent). The
    report now says the share depends on #I."""
    src = tmp_path / "attn.habu"
    src.write_text("2 EXTENT: #B 64 EXTENT: #D 128 EXTENT: #E 1 EXTENT: #H 1..64 EXTENT: #I 17 EXTENT: #J\n"
                   "bf16 TENSOR: Q ( #H #I #E #B )  bf16 TENSOR: K ( #B #H #J #E )  bf16 TENSOR: V ( #B #J #H #D )\n"
                   "f32 TENSOR: O ( #D #I #H #B )\n"
                   "MODEL: FZ  O[d i h b] = Σ j softmax_j(where(j < i, Σ e Q[h i e b] · K[b h j e] · 0.125, −∞))"
                   " · V[b j h d] ;\n")
    r = habu("compile", str(src), "-o", str(tmp_path / "out"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    report = (tmp_path / "out" / "report.md").read_text()
    assert "the share of the k steps its tiles run depends on #I" in report
