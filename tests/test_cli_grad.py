"""`habu grad` and `habu compile --backward` from the command line."""

from __future__ import annotations

import re
import subprocess
import sys

from tests.conftest import ROOT

EX = ROOT / "examples"


def habu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "habu", *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_grad_prints_the_backward_and_habu_check_reads_what_it_writes(tmp_path):
    r = habu("grad", str(EX / "ggemm.habu"))
    assert r.returncode == 0, r.stderr
    assert "MODEL: GGEMM-GRAD-1  dA[IX[m] k] += Σ n dO[m n] · B[n k] ;" in r.stdout
    assert "MODEL: GGEMM-GRAD-2  dB[n k] = Σ m dO[m n] · A[IX[m] k] ;" in r.stdout
    out = tmp_path / "grad.habu"
    r = habu("grad", str(EX / "ffn_skip.habu"), "-o", str(out), "--check")
    assert r.returncode == 0, r.stderr
    assert "finite field: <u, J v> = <J^T u, v>" in r.stderr and "central differences" in r.stderr
    assert "gradients dX of X, dW1 of W1, dB1 of B1, dW2 of W2, dB2 of B2" in r.stdout
    r = habu("check", str(out))
    assert r.returncode == 0, r.stderr
    assert "FFN-SKIP-GRAD-13" in r.stdout


def test_grad_refusals_are_errors_with_a_place_and_exit_1():
    r = habu("grad", str(EX / "ggemm.habu"), "--wrt", "IX")
    assert r.returncode == 1
    assert r.stderr.startswith(f"{EX / 'ggemm.habu'}:14:8: error: IX is an index tensor"), r.stderr
    assert "Traceback" not in r.stderr
    r = habu("grad", str(EX / "ggemm.habu"), "--save", "sometimes")
    assert r.returncode == 1 and "error: --save takes auto, save, recompute" in r.stderr
    r = habu("grad", str(EX / "ggemm.habu"), "--wrt", "Q")
    assert r.returncode == 1 and "GGEMM has no input Q" in r.stderr and "Traceback" not in r.stderr
    r = habu("grad", str(EX / "ffn_skip.habu"), "--save-value", "%9")
    assert r.returncode == 1 and "reads no such forward value (it reads %1, %2, %3" in r.stderr


def test_grad_saves_a_value_the_user_names():
    r = habu("grad", str(EX / "ffn_skip.habu"), "--save-value", "%3")
    assert r.returncode == 0, r.stderr
    assert "%3 saved as S3" in r.stdout and "dW2[h d] = Σ b dT6[b d] · S3[b h]" in r.stdout
    assert not re.search(r"(?<![A-Za-z])T3\[", r.stdout)  # GELU's output is read, not recomputed


def test_compile_backward_proves_the_derived_model(tmp_path):
    r = habu("compile", str(EX / "bmm.habu"), "--backward", "--shape", "I=64,J=64", "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "finite field: passed" in r.stdout
    assert (tmp_path / "plan.json").exists()


def test_regression_row_kernels_caching_different_words_share_one_source(tmp_path):
    # RMSNorm's backward, recomputing everything, was one source with a row kernel caching a float row and one
    # caching a bf16 row; both declared `extern __shared__ ... row_cache_all[]` with different types, which
    # NVRTC refuses (CUDA makes them one variable). Its dX kernel now keeps dY and X (bf16): two RMSNorms,
    # over a bf16 and an f32 row, make the same source
    r = habu("compile", str(ROOT / "tests" / "data" / "row_words.habu"), "--target", "sm_90a",
             "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    source = (tmp_path / "plan.cu").read_text()
    # each dynamic shared-memory array is declared with one element type across the source (the f32 kernel
    # keeps its row in registers since session 32, and declares no cache it does not read)
    declared: dict[str, set[str]] = {}
    for word, name in re.findall(r"extern __shared__ __align__\(\d+\) ([\w ]+?) (\w+)\[\];", source):
        declared.setdefault(name, set()).add(word)
    assert "unsigned short" in declared.get("row_cache_words16", set())
    assert all(len(words) == 1 for words in declared.values()), declared
    assert (tmp_path / "plan.sm_90a.cubin").exists()


def test_habu_search_backward_proves_in_worker_processes(tmp_path):
    # regression: the workers re-read the model from the file by name and did not find a derived backward;
    # by default each save policy is searched (auto and save derive the same RMSNorm backward) and the fastest named
    r = habu("search", str(EX / "rmsnorm.habu"), "--model", "RMSNORM-ROWS", "--backward",
             "--shape", "R=64,D=256", "--no-gpu", "--budget", "4", "--jobs", "2", "--target", "sm_90a",
             "--db", str(tmp_path / "db.sqlite"), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert "winner: plan" in r.stdout and "Traceback" not in r.stderr
    assert "RMSNORM-ROWS-GRAD-RECOMPUTE" in (tmp_path / "out" / "recompute" / "report.md").read_text()
    assert re.search(r"save policy (auto|recompute) is fastest .*save: the same backward as auto", r.stdout)


def test_regression_a_forward_shape_holds_for_a_backward_without_some_of_its_extents(tmp_path):
    """`habu compile scatter_histogram.habu --backward --shape R=17` answered "HISTOGRAM-GRAD has no extent #R"
    (the gradient of H[IX[r]] += 1 reads no #R), and `habu search --backward` refused #R as an unknown extent:
    the shape is the forward model's; the extents the backward does not read are left out. An extent neither
    model has is still refused."""
    hist = str(ROOT / "tests" / "data" / "general_corpus" / "scatter_histogram.habu")
    r = habu("compile", hist, "--backward", "--shape", "R=17,BIN=5", "-o", str(tmp_path / "c"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "#BIN = 5" in (tmp_path / "c" / "report.md").read_text()
    r = habu("search", hist, "--backward", "--save", "auto", "--shape", "R=17", "--budget", "2s",
             "--db", str(tmp_path / "db.sqlite"), "-o", str(tmp_path / "s"))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    r = habu("compile", hist, "--backward", "--shape", "Q=17", "-o", str(tmp_path / "q"))
    assert r.returncode == 1 and "names extent #Q, which the model does not have (it has #R, #BIN)" in r.stderr
