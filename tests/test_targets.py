"""GPU targets are one file each (habu/targets/): a toy target registered here alone goes through the
rules, the proof, emission and NVRTC with nothing else edited; compute capabilities without a
description are refused with what to do (docs/ARCHITECTURE.md, "Adding a target")."""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import pytest

from habu.cli import main
from habu.emit_cuda.nvrtc import options
from habu.errors import UsageError
from habu.targets import TARGETS, register, target_for_capability, target_named, unregister
from habu.targets.sm_80 import TARGET as SM_80
from tests.conftest import ROOT

GEMM = str(ROOT / "examples" / "gemm.habu")


@pytest.fixture
def toy():
    """sm_80 under another name (what a new target file's first draft is), registered for one test."""
    target = register(dataclasses.replace(SM_80, name="sm_toy", description="a toy copy of sm_80"))
    yield target
    unregister(target.name)


def unnamed(source: str) -> str:
    return re.sub(r"habu_gemm_[0-9a-f]{8}", "habu_gemm", source)


def habu(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`habu ARGS` in this process (so that the test's registration is seen): status, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["habu", *args])
    status = 0
    try:
        main()
    except SystemExit as exc:
        status = int(exc.code or 0)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_a_toy_target_compiles_gemm_through_rules_proof_emission_and_nvrtc(toy, tmp_path, monkeypatch, capsys):
    status, out, err = habu(monkeypatch, capsys, "compile", GEMM, "--target", "sm_toy", "--shape", "M=256",
                            "--shape", "N=256", "--shape", "K=256", "--trials", "1", "-o", str(tmp_path / "toy"))
    assert status == 0, err
    assert "obligations proved or checked at run time" in out
    plan = json.loads((tmp_path / "toy" / "plan.json").read_text())
    assert plan["target"] == "sm_toy"
    assert (tmp_path / "toy" / "plan.sm_toy.cubin").read_bytes()[:4] == b"\x7fELF"
    assert "## Kernels (sm_toy" in (tmp_path / "toy" / "report.md").read_text()
    # the same description under another name: the same kernels, printed the same (but for the
    # kernel names, which hash the plan and so its target)
    status, _, err = habu(monkeypatch, capsys, "compile", GEMM, "--target", "sm_80", "--shape", "M=256",
                         "--shape", "N=256", "--shape", "K=256", "--trials", "1", "-o", str(tmp_path / "sm80"))
    assert status == 0, err
    assert json.loads((tmp_path / "sm80" / "plan.json").read_text())["kernels"] == plan["kernels"]
    toy_cu, sm80_cu = ((tmp_path / d / "plan.cu").read_text() for d in ("toy", "sm80"))
    assert toy_cu != sm80_cu and unnamed(toy_cu) == unnamed(sm80_cu)


@pytest.mark.slow  # over 3 s: the full suite runs it, the inner loop does not
def test_a_toy_targets_limits_are_what_the_rules_check(tmp_path, monkeypatch, capsys):
    """48 KB of shared memory per block: a 4-stage 128x128x32 bf16 tile (about 80 KB with its
    epilogue) breaks smem-budget there, and fits on sm_80 (163 KB)."""
    small = register(dataclasses.replace(SM_80, name="sm_toy_small", smem_per_block=48 * 1024))
    try:
        pins = ["--pin", "tile=128x128x32", "--pin", "mma=mma.sync", "--pin", "stages=4"]
        status, _, err = habu(monkeypatch, capsys, "compile", GEMM, "--target", small.name, *pins, "--trials", "1",
                              "-o", str(tmp_path / "small"))
        assert status == 1 and "breaks rule smem-budget" in err, err
        status, _, err = habu(monkeypatch, capsys, "compile", GEMM, "--target", "sm_80", *pins, "--trials", "1",
                              "-o", str(tmp_path / "sm80"))
        assert status == 0, err
    finally:
        unregister(small.name)


def test_a_target_compiles_for_its_own_nvrtc_arch(toy):
    assert "--gpu-architecture=sm_80" in options("sm_toy", ())
    assert "--gpu-architecture=sm_90a" in options("sm_90a", ())


def test_a_second_target_of_one_name_is_refused(toy):
    with pytest.raises(ValueError, match="sm_toy"):
        register(toy)
    assert TARGETS["sm_toy"] is toy


def test_each_built_in_target_is_its_capability():
    assert [target_for_capability(*t.compute_capability) for t in TARGETS.values()] == list(TARGETS)


@pytest.mark.parametrize("cc", [(8, 6), (8, 9)])
def test_regression_8_6_is_not_mapped_to_sm_80_and_the_user_is_told_what_to_do(cc):
    """target_for_capability called an 8.6 part sm_86 (then unknown) while the driver ran it as sm_80,
    whose 163 KB of shared memory per block it does not have (99 KB)."""
    arch = f"sm_{cc[0]}{cc[1]}"
    with pytest.raises(UsageError, match=rf"compute capability {cc[0]}\.{cc[1]}.*99 KB.*habu/targets/{arch}\.py"):
        target_for_capability(*cc)
    with pytest.raises(UsageError, match=rf"unknown target '{arch}'.*99 KB.*Adding a target"):
        target_named(arch)


def test_an_unknown_capability_names_the_targets_and_how_to_add_one():
    with pytest.raises(UsageError, match=r"compute capability 7\.5 \(targets: sm_80 \(8\.0\), .*Adding a target"):
        target_for_capability(7, 5)


def test_the_cli_refuses_sm_86_with_the_reason(tmp_path, monkeypatch, capsys):
    status, _, err = habu(monkeypatch, capsys, "compile", GEMM, "--target", "sm_86", "-o", str(tmp_path))
    assert status == 1 and "Traceback" not in err and "99 KB" in err and "habu/targets/sm_86.py" in err


def test_regression_running_out_of_memory_in_a_proof_is_an_error_line_not_a_traceback(monkeypatch, capsys, tmp_path):
    """The Qwen3 MoE backward's proof raised MemoryError under a 6 GB limit and printed a traceback."""
    import importlib

    def no_memory(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(importlib.import_module("habu.compile"), "compile_model", no_memory)
    status, _, err = habu(monkeypatch, capsys, "compile", GEMM, "--shape", "M=256", "-o", str(tmp_path / "o"))
    assert status == 1 and err.startswith("error: out of memory") and "Traceback" not in err
