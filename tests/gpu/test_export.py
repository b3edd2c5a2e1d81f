"""`habu export` on the GPU: a C program built with nvcc against the bundle (its header, its launcher,
the embedded cubins, -lcuda) runs the model on small inputs and writes the outputs to files, which
are compared here with the float64 reference.

Each case exports a plan (CPU: prove, emit, compile), writes a generic C driver for it (`main.c`:
read each input tensor from NAME.bin, allocate the outputs, call habu_<model>(...) on a created
stream, write NAME.out), builds it with `nvcc main.c <model>.c -lcuda` and runs it once per size of
the runtime extents. The driver also reports the launcher's CUresult, so a size outside the declared
extents is checked to be refused with CUDA_ERROR_INVALID_VALUE (1) and nothing launched."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from habu.emit_cuda.arrays import ELEMENT_BYTES
from habu.emit_cuda.driver import bf16_bits_to_float, float_to_bf16_bits
from habu.emit_cuda.launcher_c import c_name

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL_GGEMM = """\
128 EXTENT: #M
256 EXTENT: #N
1..65536 EXTENT: #K
bf16 TENSOR:  A  ( #M #K )
bf16 TENSOR:  B  ( #N #K )
f32  TENSOR:  O  ( #M #N )
ITENSOR: IX ( #M #M )
MODEL: GGEMM  O[m n] = Σ k A[ IX[m] k ] · B[n k] ;
"""

# (id, .habu source or example file, --shape, --pin, runtime sizes to run)
CASES = [
    ("ggemm-runtime-k-tma", SMALL_GGEMM, {}, {"B": "tma"}, [{"K": 512}, {"K": 511}, {"K": 64}]),
    ("ggemm-split-k-staged", "ggemm.habu", {"M": 128, "N": 128, "K": 511}, {"split_k": "2"}, [{}]),
    ("ggemm-persistent-cluster", "ggemm.habu", {"M": 2048, "N": 1024, "K": 256},  # more tiles than SMs
     {"persistent": "true", "cluster": "2", "B": "tma", "split_k": "1", "tile": "128x128x64"}, [{}]),
    ("rmsnorm-linear", "rmsnorm_linear.habu", {"T": 128, "D": 256, "N": 256}, {}, [{}]),
    ("softmax-prefetch", "softmax.habu", {"R": 1500, "C": 2048},  # more rows than resident blocks
     {"row_prefetch": "true", "cache_row": "true", "threads": "256"}, [{}]),
    ("softmax-row-cluster", "softmax.habu", {"R": 16, "C": 65536}, {"threads": "512", "row_cluster": "2"}, [{}]),
    ("ffn-skip", "ffn_skip.habu", None, {}, [{}]),  # shapes from small_ffn_shape
]
REFUSED = 1  # CUDA_ERROR_INVALID_VALUE


def _program(source: str, tmp: Path):
    from habu.spec.parser import load_program

    if source.endswith(".habu") and "\n" not in source:
        return load_program(EXAMPLES / source)
    path = tmp / "model.habu"
    path.write_text(source)
    return load_program(path)


def small_ffn_shape(model) -> dict[str, int]:
    """ffn_skip's wide extents (#D, #H) shrunk to 256; #B (128) and #ONE (1) kept."""
    return {e.name: 256 for e in model.extents if e.size is not None and e.size > 256}


def prepare(case, tmp: Path):
    """Export the case's plan into tmp/bundle; returns the launch description and the bundle dir."""
    from habu.compile import compile_model
    from habu.export import export_bundle
    from habu.target import target_named

    _, source, shape, pins, _ = case
    program = _program(source, tmp)
    m = program.pick(None)
    if shape is None:
        shape = small_ffn_shape(m)
    target = target_named("sm_90a")
    compiled = compile_model(program, m.name, shape, target, pins, trials=1)
    bundle = tmp / "bundle"
    files = export_bundle([(compiled, target)], bundle)
    import json

    desc = json.loads(next(f for f in files if f.suffix == ".json").read_text())
    (bundle / "main.c").write_text(driver_program(desc))
    return desc, bundle, compiled.model


def _numel_c(extents, desc) -> str:
    static = desc["static_extents"]
    return " * ".join(f"(size_t){static.get(e, e)}" for e in extents) or "(size_t)1"


def driver_program(desc) -> str:
    """main.c: argv[1] = a directory with NAME.bin per input (or -: read none); then the runtime extents; writes NAME.out
    per output and prints `status N` (the launcher's CUresult)."""
    fn = c_name(desc["model"])
    stem = fn[len("habu_"):]
    lines = ["#include <stdio.h>", "#include <stdlib.h>", "#include <string.h>", f'#include "{stem}.h"', "",
             "#define CHECK(x) do { CUresult e_ = (x); if (e_ != CUDA_SUCCESS) { const char* s_ = 0; "
             'cuGetErrorName(e_, &s_); fprintf(stderr, "%s failed: %s\\n", #x, s_ ? s_ : "?"); return 2; } } while (0)',
             "", "int main(int argc, char** argv) {",
             f"  if (argc != {2 + len(desc['runtime_extents'])}) {{ fprintf(stderr, \"usage\\n\"); return 3; }}",
             "  const char* dir = argv[1];", "  char path[4096];"]
    for i, e in enumerate(desc["runtime_extents"]):
        lines.append(f"  int64_t {e} = atoll(argv[{2 + i}]);")
    lines += ["  CUdevice dev; CUcontext ctx; CUstream stream;", "  CHECK(cuInit(0));", "  CHECK(cuDeviceGet(&dev, 0));",
              "  CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));", "  CHECK(cuCtxSetCurrent(ctx));",
              "  CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));"]
    for t in desc["tensors"]:
        n = t["name"]
        nbytes = f"({_numel_c(t['extents'], desc)} * {ELEMENT_BYTES[t['dtype']]})"
        lines += [f"  size_t bytes_{n} = {nbytes};", f"  void* host_{n} = malloc(bytes_{n} ? bytes_{n} : 1);",
                  f"  CUdeviceptr dev_{n};", f"  CHECK(cuMemAlloc(&dev_{n}, bytes_{n} ? bytes_{n} : 1));"]
        if t["role"] == "input":
            lines += [f'  snprintf(path, sizeof path, "%s/{n}.bin", dir);',
                      "  if (strcmp(dir, \"-\") != 0) { FILE* f = fopen(path, \"rb\"); if (!f) { perror(path); return 4; }",
                      f"    if (fread(host_{n}, 1, bytes_{n}, f) != bytes_{n}) {{ fprintf(stderr, \"short %s\\n\", path); "
                      "return 4; }", "    fclose(f); }",
                      f"  CHECK(cuMemcpyHtoD(dev_{n}, host_{n}, bytes_{n}));"]
        else:  # poison the outputs: every element the launcher does not write shows
            lines.append(f"  CHECK(cuMemsetD8(dev_{n}, 0xff, bytes_{n}));")
    args = [f"dev_{t['name']}" for t in desc["tensors"]] + list(desc["runtime_extents"]) + ["stream"]
    lines += [f"  CUresult status = {fn}({', '.join(args)});", '  printf("status %d\\n", (int)status);',
              "  if (status != CUDA_SUCCESS) return 0;", "  CHECK(cuStreamSynchronize(stream));"]
    for t in desc["tensors"]:
        if t["role"] == "output":
            n = t["name"]
            lines += [f"  CHECK(cuMemcpyDtoH(host_{n}, dev_{n}, bytes_{n}));",
                      f'  snprintf(path, sizeof path, "%s/{n}.out", dir);',
                      f"  {{ FILE* f = fopen(path, \"wb\"); fwrite(host_{n}, 1, bytes_{n}, f); fclose(f); }}"]
    lines += [f"  {fn}_unload();", "  return 0;", "}", ""]
    return "\n".join(lines)


def inputs_for(desc, sizes: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs at `sizes`: bf16-representable floats in [-1, 1), index values in range."""
    rng = np.random.default_rng(seed)
    all_sizes = dict(desc["static_extents"]) | sizes
    out = {}
    for t in desc["tensors"]:
        if t["role"] != "input":
            continue
        shape = tuple(all_sizes[e] for e in t["extents"])
        if t["index_range"]:
            out[t["name"]] = rng.integers(0, all_sizes[t["index_range"]], size=shape).astype(np.int32)
        else:
            vals = rng.uniform(-1, 1, size=shape).astype(np.float32)
            out[t["name"]] = bf16_bits_to_float(float_to_bf16_bits(vals)).reshape(shape) if t["dtype"] == "bf16" \
                else vals
    return out


def write_inputs(desc, arrays: dict[str, np.ndarray], where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    for t in desc["tensors"]:
        if t["role"] != "input":
            continue
        a = arrays[t["name"]]
        if t["dtype"] == "bf16":
            raw = float_to_bf16_bits(a)
        elif t["index_range"]:
            raw = a.astype({"i16": np.int16, "i32": np.int32, "i64": np.int64}[t["dtype"]])
        else:
            raw = a.astype({"f32": np.float32, "f16": np.float16, "f64": np.float64}[t["dtype"]])
        np.ascontiguousarray(raw).tofile(where / f"{t['name']}.bin")


def read_outputs(desc, sizes: dict[str, int], where: Path) -> dict[str, np.ndarray]:
    all_sizes = dict(desc["static_extents"]) | sizes
    out = {}
    for t in desc["tensors"]:
        if t["role"] != "output":
            continue
        shape = tuple(all_sizes[e] for e in t["extents"])
        raw = np.fromfile(where / f"{t['name']}.out", dtype={"bf16": np.uint16, "f32": np.float32,
                                                             "f16": np.float16}[t["dtype"]])
        out[t["name"]] = (bf16_bits_to_float(raw) if t["dtype"] == "bf16" else raw.astype(np.float32)).reshape(shape)
    return out


def check_close(name: str, got: np.ndarray, ref: np.ndarray, dtype: str) -> None:
    assert np.isfinite(got).all(), f"{name}: non-finite values (poisoned elements never written?)"
    scale = max(1.0, float(np.abs(ref).max()))
    tol = (2e-2 if dtype == "bf16" else 2e-3) * scale
    err = float(np.abs(got.astype(np.float64) - ref).max())
    assert err <= tol, f"{name}: max error {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_exported_bundle_runs_from_c(case, tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    from habu.spec.reference import evaluate

    desc, bundle, model = prepare(case, tmp_path)
    stem = c_name(desc["model"])[len("habu_"):]
    r = subprocess.run([nvcc, "-O2", "-o", "run", "main.c", f"{stem}.c", "-lcuda"], cwd=bundle, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    for i, sizes in enumerate(case[4]):
        where = tmp_path / f"run{i}"
        arrays = inputs_for(desc, sizes, seed=i)
        write_inputs(desc, arrays, where)
        run = subprocess.run([str(bundle / "run"), str(where), *(str(sizes[e]) for e in desc["runtime_extents"])],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and "status 0" in run.stdout, (sizes, run.stdout, run.stderr)
        got = read_outputs(desc, sizes, where)
        ref = evaluate(model, {k: v if v.dtype.kind == "i" else v.astype(np.float64) for k, v in arrays.items()}, sizes)
        for t in desc["tensors"]:
            if t["role"] == "output":
                check_close(f"{case[0]} {sizes} {t['name']}", got[t["name"]], ref[t["name"]], t["dtype"])
    if desc["runtime_extents"]:  # a size outside the declared extents: refused, nothing launched
        bad = {e: desc["extent_ranges"][e]["hi"] + 1 for e in desc["runtime_extents"]}
        run = subprocess.run([str(bundle / "run"), "-", *(str(bad[e]) for e in desc["runtime_extents"])],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0 and f"status {REFUSED}" in run.stdout, (bad, run.stdout, run.stderr)
