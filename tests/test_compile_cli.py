"""habu compile / habu verify: plans, reports, and the K = 511 negative compile tests."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def habu(*args: str, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "habu", *args], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_k511_with_tma_on_b_is_rejected_citing_the_16_byte_rule(tmp_path):
    r = habu("compile", "examples/ggemm.habu", "--shape", "K=511", "--pin", "B=tma", "-o", str(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith("examples/ggemm.habu:14:8: error: the plan for GGEMM breaks rule tma-stride-16B")
    assert "the row stride of B is 1022 bytes, not a multiple of 16" in r.stderr
    assert "Triton #10927" in r.stderr


def test_k511_gather4_on_sm100a_is_rejected(tmp_path):
    r = habu("compile", "examples/ggemm.habu", "--shape", "K=511", "--target", "sm_100a", "--pin", "A=tma",
             "-o", str(tmp_path))
    assert r.returncode == 1 and "tma-stride-16B" in r.stderr and "row stride of A is 1022 bytes" in r.stderr


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_k512_with_tma_compiles_and_verifies(tmp_path):
    r = habu("compile", "examples/ggemm.habu", "--shape", "K=512", "--pin", "B=tma", "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["kernels"][0]["b_move"] == "tma" and plan["shape"]["K"] == 512
    report = (tmp_path / "report.md").read_text()
    assert "tma-stride-16B" in report and "| proved |" in report and "finite-field certificate" in report
    r = habu("verify", "examples/ggemm.habu", "--plan", str(tmp_path / "plan.json"), "--trials", "1")
    assert r.returncode == 0 and "obligations hold" in r.stdout


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_verify_rejects_a_hand_edited_plan_that_breaks_a_rule(tmp_path):
    r = habu("compile", "examples/ggemm.habu", "--shape", "K=512", "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "plan.json").read_text())
    data["kernels"][0]["a_move"] = "tma"  # TMA cannot gather A's rows on sm_90a
    (tmp_path / "bad.json").write_text(json.dumps(data))
    r = habu("verify", "examples/ggemm.habu", "--plan", str(tmp_path / "bad.json"))
    assert r.returncode == 1 and "tma-gather" in r.stderr
    data["model_hash"] = "0" * 64
    (tmp_path / "other.json").write_text(json.dumps(data))
    r = habu("verify", "examples/ggemm.habu", "--plan", str(tmp_path / "other.json"))
    assert r.returncode == 1 and "made for another computation" in r.stderr
    (tmp_path / "junk.json").write_text("{nope")
    r = habu("verify", "examples/ggemm.habu", "--plan", str(tmp_path / "junk.json"))
    assert r.returncode == 1 and "is not JSON" in r.stderr


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_runtime_extent_compiles_to_a_checked_set(tmp_path):
    src = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
    f = tmp_path / "g.habu"
    f.write_text(src)
    r = habu("compile", str(f), "--pin", "B=tma", "-o", str(tmp_path / "out"), "--trials", "1")
    assert r.returncode == 0, r.stderr
    p1 = json.loads((tmp_path / "out" / "plan1.json").read_text())
    p2 = json.loads((tmp_path / "out" / "plan2.json").read_text())
    assert p1["guards"] and not p2["guards"]
    assert p2["kernels"][0]["b_move"] == "ldg"


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_bad_pin_and_target_are_usage_errors(tmp_path):
    r = habu("compile", "examples/ggemm.habu", "--pin", "tile=12", "-o", str(tmp_path))
    assert r.returncode == 1 and "expected BMxBNxBK" in r.stderr
    r = habu("compile", "examples/ggemm.habu", "--target", "sm_75", "-o", str(tmp_path))
    assert r.returncode == 1 and "unknown target" in r.stderr


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_compile_writes_source_cubin_and_resources(tmp_path):
    r = habu("compile", "examples/ggemm.habu", "--shape", "K=511", "-o", str(tmp_path), "--trials", "1")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "plan.cu").read_text().count("__global__") == 3
    assert (tmp_path / "plan.sm_90a.cubin").read_bytes()[:4] == b"\x7fELF"
    report = (tmp_path / "report.md").read_text()
    assert "## Kernels (sm_90a" in report and "| registers |" in report.replace(" registers ", " registers ")


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_emit_writes_the_source_alone(tmp_path):
    r = habu("emit", "examples/ffn_skip.habu", "-o", str(tmp_path / "ffn.cu"), "--target", "sm_80")
    assert r.returncode == 0, r.stderr
    src = (tmp_path / "ffn.cu").read_text()
    assert (src.count("__global__") == 3 and "mma.sync" in src) or "habu::mma_bf16_16816" in src


@pytest.mark.slow  # 18 s: a full compile
def test_pin_rewrite_compiles_the_factored_rmsnorm_linear(tmp_path):
    r = habu("compile", "examples/rmsnorm_linear.habu", "--pin", "rewrite=factor:Y", "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["rewrites"] == ["factor:Y"] and [k["nodes"] for k in plan["kernels"]] == [["Y.scale"], ["Y.sum", "Y"]]
    assert "rewrites factor:Y" in (tmp_path / "report.md").read_text()


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_pin_rewrite_that_does_not_apply_names_those_that_do():
    r = habu("compile", "examples/rmsnorm_linear.habu", "--pin", "rewrite=inline:Y")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "rewrites that apply to RMSNORM-LINEAR: factor:Y" in r.stderr


def test_regression_a_movement_pin_failed_on_the_row_kernel_of_a_two_kernel_model(tmp_path):
    """`--pin B=staged` on RMSNorm + Linear was applied to the row kernel too: 'unknown key'."""
    r = habu("compile", "examples/rmsnorm_linear.habu", "--pin", "B=staged", "--pin", "mma=wgmma",
             "-o", str(tmp_path))
    assert r.returncode == 0, r.stderr
    kernels = json.loads((tmp_path / "plan.json").read_text())["kernels"]
    assert kernels[1]["b_move"] == "staged" and kernels[1]["mma"] == "wgmma"


def test_compile_and_emit_build_for_this_machines_gpu_by_default_as_search_does(tmp_path, monkeypatch):
    """`compile` defaulted to sm_90a while `search` built for the machine's GPU: both now take the
    machine's architecture (sm_90a where there is no GPU), and `--target` still overrides it."""
    import habu.gpu_info
    from habu.cli import app

    monkeypatch.setattr(habu.gpu_info, "current_arch", lambda: "sm_80")
    app(["compile", str(ROOT / "examples" / "fused.habu"), "-o", str(tmp_path / "a"), "--trials", "1"],
        standalone_mode=False)
    assert (tmp_path / "a" / "plan.sm_80.cubin").exists()
    app(["compile", str(ROOT / "examples" / "fused.habu"), "-o", str(tmp_path / "b"), "--trials", "1",
         "--target", "sm_90a"], standalone_mode=False)
    assert (tmp_path / "b" / "plan.sm_90a.cubin").exists()


def test_regression_a_shape_putting_a_constant_index_outside_its_extent_is_refused_naming_the_read(tmp_path):
    """`habu compile scalar_elementwise.habu --shape N=1` (S = X[3]·2 + 1) answered that the plan breaks the
    bounds rule, with a hint to pin another data movement: no plan can read X[3] of one element. The shape is
    refused naming the read (found by a sweep of the general corpus at sizes 1, 17 and 300)."""
    path = str(ROOT / "tests" / "data" / "general_corpus" / "scalar_elementwise.habu")
    r = habu("compile", path, "--shape", "N=1", "-o", str(tmp_path / "a"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "--shape N=1: SCALAR-MAP reads X[3], index 3 of #N, which then has 1 element(s)" in r.stderr
    assert "--pin" not in r.stderr
    r = habu("compile", path, "--shape", "N=4", "-o", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
