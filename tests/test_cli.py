"""The command line: check, eval, words, --version; errors exit 1 without a traceback."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import EXAMPLES, ROOT


def habu(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "habu", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_version_and_help():
    r = habu("--version")
    assert r.returncode == 0 and r.stdout.startswith("habu ")
    r = habu("--help")
    assert r.returncode == 0 and "check" in r.stdout and "eval" in r.stdout


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_check_runs_on_every_example(path):
    r = habu("check", str(path.relative_to(ROOT)))
    assert r.returncode == 0, r.stderr
    assert "MODEL " in r.stdout and "obligations" in r.stdout and "dataflow" in r.stdout


def test_check_prints_extents_dataflow_and_obligations_for_ggemm():
    r = habu("check", "examples/ggemm.habu")
    out = r.stdout
    assert "#M = 4096" in out and "#K = 4096" in out
    assert "A[IX[m] k]   (index 1 gathered through IX[m])" in out
    assert "every value of IX is in 0..4095" in out
    assert "A ( #M #K ) bf16" in out and "O ( #M #N ) f32" in out


def test_user_error_exits_1_with_location_and_no_traceback(tmp_path):
    bad = tmp_path / "bad.habu"
    bad.write_text("4 EXTENT: #M\nTENSOR: A ( #M #Q )\n")
    r = habu("check", str(bad))
    assert r.returncode == 1
    assert r.stderr.startswith(f"{bad}:2:16: error: unknown extent #Q")
    assert "Traceback" not in r.stderr and "^" in r.stderr


def test_missing_file_is_a_clean_error():
    r = habu("check", "no/such/file.habu")
    assert r.returncode == 1 and "no such file" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args, says", [
    (("show", "examples/ggemm.habu"), "No such command 'show'"),
    (("check", "--bogus", "examples/ggemm.habu"), "No such option: --bogus"),
    (("search",), "Missing argument"),
])
def test_regression_click_usage_error_printed_a_traceback(args, says):
    """typer 0.29 raises its vendored click's UsageError, which `main` did not recognise."""
    r = habu(*args)
    assert r.returncode == 2, r.stderr
    assert says in r.stderr and "Traceback" not in r.stderr


def test_eval_round_trip(tmp_path):
    src = tmp_path / "g.habu"
    src.write_text((ROOT / "tests" / "seed" / "ggemm.habu").read_text())
    rng = np.random.default_rng(0)
    a, b, ix = rng.standard_normal((128, 32)), rng.standard_normal((64, 32)), rng.integers(0, 128, 128).astype(np.int32)
    np.savez(tmp_path / "in.npz", A=a.astype(np.float32), B=b.astype(np.float32), IX=ix)
    r = habu("eval", str(src), "--model", "GGEMM", "--inputs", str(tmp_path / "in.npz"), "--output", str(tmp_path / "out.npz"))
    assert r.returncode == 0, r.stderr
    out = np.load(tmp_path / "out.npz")["O"]
    np.testing.assert_allclose(out, a.astype(np.float32)[ix].astype(np.float64) @ b.astype(np.float32).T.astype(np.float64),
                               rtol=1e-12, atol=1e-12)


def test_eval_shape_mismatch_names_the_tensor_and_both_shapes(tmp_path):
    src = tmp_path / "g.habu"
    src.write_text((ROOT / "tests" / "seed" / "ggemm.habu").read_text())
    np.savez(tmp_path / "in.npz", A=np.ones((128, 31)), B=np.ones((64, 32)), IX=np.zeros(128, np.int32))
    r = habu("eval", str(src), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "A should have shape ( #M #K ) = (128, 32), got (128, 31)" in r.stderr


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_eval_dtype_and_range_errors(tmp_path):
    src = tmp_path / "g.habu"
    src.write_text((ROOT / "tests" / "seed" / "ggemm.habu").read_text())
    np.savez(tmp_path / "in.npz", A=np.ones((128, 32)), B=np.ones((64, 32)), IX=np.zeros(128))
    r = habu("eval", str(src), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz"))
    assert r.returncode == 1 and "IX is an index tensor and needs integers, got float64" in r.stderr
    ix = np.zeros(128, np.int64)
    ix[5] = 130
    np.savez(tmp_path / "in.npz", A=np.ones((128, 32)), B=np.ones((64, 32)), IX=ix)
    r = habu("eval", str(src), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "o.npz"))
    assert r.returncode == 1 and "IX[5] = 130 is outside #M" in r.stderr


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_eval_runtime_extent_comes_from_the_input(tmp_path):
    x = np.random.default_rng(1).standard_normal((8192, 256))
    np.savez(tmp_path / "x.npz", X=x)
    r = habu("eval", "examples/rmsnorm.habu", "--model", "RMSNORM-ROWS", "--inputs", str(tmp_path / "x.npz"),
             "-o", str(tmp_path / "y.npz"))
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "y.npz")["Y"]
    np.testing.assert_allclose(y, x / np.sqrt((x * x).mean(1, keepdims=True) + 1e-6), rtol=1e-12)
    np.savez(tmp_path / "x.npz", X=x[:, :100])
    r = habu("eval", "examples/rmsnorm.habu", "--model", "RMSNORM-ROWS", "--inputs", str(tmp_path / "x.npz"),
             "-o", str(tmp_path / "y.npz"))
    assert r.returncode == 1 and "#D = 100 is outside its declared range" in r.stderr


def test_words_lists_the_library():
    r = habu("words")
    assert r.returncode == 0
    assert "LINEAR" in r.stdout and "( x -- y | w b )" in r.stdout and "RMSNORM" in r.stdout


def test_bad_shape_option():
    r = habu("eval", "examples/gemm.habu", "--inputs", "x.npz", "-o", "y.npz", "--shape", "Q=3")
    assert r.returncode == 1 and "#Q" in r.stderr


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
@pytest.mark.parametrize("n", [500, 5000])
def test_regression_flat_chain_of_500_terms_check_and_eval_gave_recursion_error(tmp_path, n):
    src = tmp_path / "chain.habu"
    src.write_text("8 EXTENT: #M\nTENSOR: X ( #M )\nTENSOR: Y ( #M )\nMODEL: M Y[m] = X[m]" + " + 1" * n + " ;\n")
    r = habu("check", str(src))
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "Y[m] <- X[m]" in r.stdout
    np.savez(tmp_path / "in.npz", X=np.arange(8.0))
    r = habu("eval", str(src), "--inputs", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert np.array_equal(np.load(tmp_path / "out.npz")["Y"], np.arange(8.0) + n)


def test_regression_doubling_words_check_ran_56_seconds(tmp_path):
    src = tmp_path / "w16.habu"
    src.write_text("8 EXTENT: #M\nTENSOR: X ( #M )\nTENSOR: Y ( #M )\n: W0 ( x -- y ) GELU ;\n"
                   + "".join(f": W{i} ( x -- y ) W{i - 1} W{i - 1} ;\n" for i in range(1, 17))
                   + "MODEL: M ( X -- Y ) W16 ;\n")
    r = habu("check", str(src))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"{src}:17:3: error: W13 would expand to 24,574 words (at most 20,000)")


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_regression_compile_of_f8e4m3_and_i8_to_i32_gave_key_error(tmp_path):
    for x, y, says in [("f8e4m3", "f32", "tensor X cannot be f8e4m3"), ("i8", "i32", "Y is i32, and kernels store only")]:
        src = tmp_path / "d.habu"
        src.write_text(f"128 EXTENT: #M\n{x} TENSOR: X ( #M )\n{y} TENSOR: Y ( #M )\nMODEL: M Y[m] = X[m] + 1 ;\n")
        r = habu("compile", str(src), "-o", str(tmp_path / "out"))
        assert r.returncode == 1 and "Traceback" not in r.stderr and says in r.stderr, r.stderr[-2000:]


def test_words_lists_the_element_types():
    r = habu("words")
    assert r.returncode == 0 and "element types: f64 f32 bf16 f16 i8 i16 i32 i64" in r.stdout


def test_regression_an_internal_error_is_one_line_naming_it_with_exit_status_70(monkeypatch, capsys, tmp_path):
    """`habu compile examples/attention.habu --backward --shape D=1` printed a 30-line traceback from the witness's
    coverage proof (a Habu bug, fixed: tests/prove/test_witness_blocks.py). A fault of Habu's now ends in one line
    naming the exception and where it was raised, exit status 70 (EX_SOFTWARE); HABU_TRACEBACK=1 re-raises it."""
    import habu.compile
    from habu.cli import INTERNAL_ERROR, main

    def planted(*args, **kwargs):
        raise AssertionError("kernel 2 (dK): a planted fault\nover two lines")

    monkeypatch.setattr(habu.compile, "compile_model", planted)
    monkeypatch.setattr(sys, "argv", ["habu", "compile", str(ROOT / "examples" / "gemm.habu"), "-o", str(tmp_path)])
    monkeypatch.delenv("HABU_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as ended:
        main()
    err = capsys.readouterr().err
    assert ended.value.code == INTERNAL_ERROR == 70
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "internal error" in err and "AssertionError at test_cli.py:" in err and "a planted fault over two lines" in err
    monkeypatch.setenv("HABU_TRACEBACK", "1")
    with pytest.raises(AssertionError, match="planted fault"):
        main()
