"""Kernels outside Python: `habu emit`'s standalone .cu, its launch geometry, and `habu export`'s C bundle."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from habu.compile import compile_model
from habu.emit_cuda.guards import eval_guard
from habu.emit_cuda.launcher_c import guard_c
from habu.emit_cuda.nvrtc import INCLUDE_DIR, _nvrtc, compile_cuda
from habu.emit_cuda.standalone import grid_formula, inlined_headers
from habu.export import export_bundle, standalone
from habu.spec.parser import load_program, parse_text
from habu.target import target_named
from tests.conftest import ROOT

SM90 = target_named("sm_90a")
RUNTIME_K = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")


def habu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "habu", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)


@cache
def compiled(example: str, shape: tuple = (), pins: tuple = ()):
    program = parse_text(RUNTIME_K, "g.habu") if example == "runtime-k" else load_program(ROOT / "examples" / example)
    return compile_model(program, program.pick(None).name, dict(shape), SM90, dict(pins), trials=1)


def cuda_include() -> Path | None:
    for d in (Path("/usr/local/cuda/include"),):
        if (d / "cuda.h").is_file():
            return d
    nvcc = shutil.which("nvcc")
    if nvcc:
        d = Path(nvcc).resolve().parent.parent / "include"
        if (d / "cuda.h").is_file():
            return d
    return None


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or (str(p) if (p := Path("/usr/local/cuda/bin/nvcc")).is_file() else None)


# ----------------------------------------------------------------------------- the standalone .cu


def test_inlined_headers_are_each_present_once_in_dependency_order():
    text = inlined_headers()
    # every kernel header (memory/narrow.cuh is the runtime's own narrowing module, habu.emit_cuda.narrow,
    # never part of a kernel's source)
    headers = sorted(p.relative_to(INCLUDE_DIR).as_posix() for p in INCLUDE_DIR.rglob("*.cuh")
                     if p.name != "narrow.cuh")
    for h in headers:
        assert text.count(f"// from {h}\n") == 1, h
    assert "#include" not in text and "#pragma once" not in text
    assert text.index("// from habu/types.cuh") < text.index("// from habu/memory/global.cuh")
    assert "__CUDA_ARCH__ >= 900" in text  # habu.cuh's conditional kept around the sm_90 headers


@pytest.mark.parametrize("example,shape,pins", [
    ("ggemm.habu", (("K", 512),), (("B", "tma"),)),
    ("runtime-k", (), (("B", "tma"),)),  # a checked kernel set: a guarded member and its fallback
    ("rmsnorm_linear.habu", (), ()),
])
def test_standalone_source_compiles_with_nvrtc_and_no_include_path(example, shape, pins):
    if _nvrtc() is None:
        pytest.skip("NVRTC cannot be loaded here")
    source, desc = standalone(compiled(example, shape, pins), SM90)
    assert '#include "habu/' not in source
    names = [k["name"] for m in desc["members"] for k in m["kernels"]]
    assert source.startswith("/*") and all(n in source.split("*/")[0] for n in names)
    cubin = compile_cuda(source, "standalone", "sm_90a", include_dirs=())
    assert cubin.cubin and all(n.encode() in cubin.cubin for n in names)


def test_standalone_source_compiles_with_nvcc(tmp_path):
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    source, _ = standalone(compiled("ggemm.habu", (("K", 512),), (("B", "tma"),)), SM90)
    (tmp_path / "kernel.cu").write_text(source)
    r = subprocess.run([nvcc, "-cubin", "-arch=sm_90a", "kernel.cu", "-o", "kernel.cubin"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "kernel.cubin").stat().st_size > 0


def _eval_c(formula: str, sizes: dict[str, int]) -> int:
    """A grid formula's value: C's long long arithmetic over non-negative values, in Python."""
    text = re.sub(r"(\d+)LL", r"\1", formula).replace("(long long)", "").replace("/", "//")
    return int(eval(text, {"min": min, "max": max, "__builtins__": {}}, dict(sizes)))


@pytest.mark.parametrize("example,shape,pins", [
    ("runtime-k", (), (("B", "tma"),)),
    ("runtime-k", (), (("persistent", "true"),)),
    ("ggemm.habu", (("K", 511),), (("split_k", "2"),)),  # staging passes and a split
    ("softmax.habu", (), (("row_prefetch", "true"),)),
    ("ffn_skip.habu", (), ()),
])
def test_grid_formula_is_the_grid_the_runtime_launches(example, shape, pins):
    c = compiled(example, shape, pins)
    static = {e.name: e.size for e in c.model.extents if e.size is not None}
    runtime = [e.name for e in c.model.extents if e.size is None]
    from habu.paths.emit import emit

    for proof in c.proofs:
        for k in emit(proof, SM90).kernels:
            formula = grid_formula(k, static)
            for value in (1, 7, 64, 511, 4096, 65536) if runtime else (None,):
                sizes = dict(static) | ({e: value for e in runtime} if value else {})
                for slots in (132, 264):
                    expect = k.grid(sizes, slots)
                    got = tuple(_eval_c(f, sizes | {"SLOTS": slots}) for f in formula)
                    assert got == expect, (k.name, formula, sizes, slots)


def test_geometry_json_lists_each_kernels_launch(tmp_path):
    desc = standalone(compiled("ggemm.habu", (("K", 512),), (("B", "tma"),)), SM90)[1]
    k = desc["members"][0]["kernels"][0]
    assert k["block"][0] > 0 and k["dynamic_smem"]["bytes"] > 48 * 1024
    tm = {t["tensor"]: t for t in k["tensor_maps"]}
    assert tm["B"]["dtype"] == "bf16" and tm["B"]["dims"] == ["K", "N"] and tm["B"]["swizzle"] == 128
    assert [p["kind"] for p in k["params"]].count("tensormap") == len(k["tensor_maps"])
    assert [t["name"] for t in desc["tensors"]] == ["A", "IX", "B", "O"]


# ----------------------------------------------------------------------------- the CLI


def test_emit_writes_a_standalone_cu_and_its_geometry(tmp_path):
    r = habu("emit", "examples/ggemm.habu", "--shape", "K=512", "-o", str(tmp_path / "k" / "kernel.cu"))
    assert r.returncode == 0, r.stderr
    source = (tmp_path / "k" / "kernel.cu").read_text()
    desc = json.loads((tmp_path / "k" / "kernel.json").read_text())
    assert '#include "habu/' not in source and "// from habu/types.cuh" in source
    assert desc["members"][0]["kernels"][0]["name"] in source


def test_regression_emit_to_a_directory_fails_before_any_work(tmp_path):
    r = habu("emit", "examples/ggemm.habu", "-o", str(tmp_path))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "is a directory" in r.stderr


def test_export_refuses_a_file_as_its_directory(tmp_path):
    (tmp_path / "f").write_text("")
    r = habu("export", "examples/ggemm.habu", "-o", str(tmp_path / "f"))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "is a file" in r.stderr


# ----------------------------------------------------------------------------- the C bundle


def _gcc(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["gcc", *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("example,shape,pins", [
    ("runtime-k", (), (("B", "tma"),)),
    ("rmsnorm_linear.habu", (), ()),  # an intermediate between two kernels
    ("ggemm.habu", (("K", 511),), (("split_k", "2"),)),  # staging passes, zero-filled output
])
def test_exported_launcher_compiles_against_cuda_h(tmp_path, example, shape, pins):
    include = cuda_include()
    if include is None or shutil.which("gcc") is None or _nvrtc() is None:
        pytest.skip("needs cuda.h, gcc and NVRTC")
    files = export_bundle([(compiled(example, shape, pins), SM90)], tmp_path)
    c_file = next(f for f in files if f.suffix == ".c")
    h_file = next(f for f in files if f.suffix == ".h")
    assert any(f.suffix == ".cubin" and f.stat().st_size for f in files)
    r = _gcc(["-std=c99", "-Wall", "-Wextra", "-Werror", "-c", c_file.name, f"-I{include}", "-o", "l.o"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    (tmp_path / "use.cpp").write_text(f'#include "{h_file.name}"\nint main() {{ return 0; }}\n')
    r = subprocess.run(["g++", "-fsyntax-only", "use.cpp", f"-I{include}"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr  # the header is C++-clean too
    text = c_file.read_text()
    assert "cuModuleLoadData" in text and "cuLaunchKernel" in text
    if "tensormap" in json.dumps(json.loads(next(f for f in files if f.suffix == ".json").read_text())):
        assert "cuTensorMapEncodeTiled" in text


def test_guards_in_c_decide_as_the_runtime_does(tmp_path):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    guards = ["(2*K)%16 == 0", "And(K%8 == 0, 4 <= K)", "Or(K/3 == 5, Not(K%7 != 0))", "If(K < 10, K >= 3, K%2 == 1)",
              "Implies(K > 100, (K - 1)%4 == 3)", "-K%5 == 0"]
    from habu.emit_cuda.launcher_c import _PRELUDE

    body = "\n".join(f'  printf("%d ", (int)({guard_c(g, {})}));' for g in guards)
    prelude = _PRELUDE.split("static inline CUresult habu_encode")[0]
    (tmp_path / "g.c").write_text("#include <stdio.h>\ntypedef int CUresult;\n#define CUDA_SUCCESS 0\n" + prelude
                                  + f"int main(int argc, char** argv) {{\n  long long K = atoll(argv[1]);\n{body}\n"
                                  "  (void)argc; return 0;\n}\n")
    r = _gcc(["-std=c99", "-include", "stdlib.h", "g.c", "-o", "g"], tmp_path)
    assert r.returncode == 0, r.stderr
    for k in (1, 3, 8, 15, 16, 21, 101, 103, 1000):
        out = subprocess.run([str(tmp_path / "g"), str(k)], capture_output=True, text=True, check=True).stdout.split()
        assert out == [str(int(eval_guard(g, {"K": k}))) for g in guards], k


def test_regression_export_for_two_targets_is_one_launcher_that_picks_by_capability(tmp_path):
    include = cuda_include()
    if include is None or shutil.which("gcc") is None or _nvrtc() is None:
        pytest.skip("needs cuda.h, gcc and NVRTC")
    r = habu("export", "examples/rmsnorm_linear.habu", "--target", "sm_90a", "--target", "sm_80", "--trials", "1",
             "--shape", "T=128,D=256,N=256", "-o", str(tmp_path / "b"))
    assert r.returncode == 0, r.stderr
    b = tmp_path / "b"
    for t in ("sm_90a", "sm_80"):
        assert (b / f"rmsnorm_linear.{t}.m0.cubin").stat().st_size and (b / f"rmsnorm_linear.{t}.json").is_file()
    text = (b / "rmsnorm_linear.c").read_text()
    assert "major == 9 && minor == 0" in text and "major == 8 && minor == 0" in text
    assert "CUDA_ERROR_NO_BINARY_FOR_GPU" in text
    r = _gcc(["-std=c99", "-Wall", "-Wextra", "-Werror", "-c", "rmsnorm_linear.c", f"-I{include}", "-o", "l.o"], b)
    assert r.returncode == 0, r.stderr[-3000:]
