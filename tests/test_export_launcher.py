"""The exported C launcher run on the CPU against a recording stand-in for the CUDA driver: every
launch it makes (grid, block, dynamic shared memory, early or not, each parameter's value), every
tensor map it encodes and every memset must be what the Python runtime (`CompiledModel`) would do
for the same sizes: `CudaKernel.grid`, `dynamic_smem`, `driver.tensormap_args`, `kernel.zero`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from habu.compile import compile_model
from habu.compile import kernel_set as compiled_kernel_set
from habu.emit_cuda.arrays import ELEMENT_BYTES, ArrayInfo, row_major
from habu.emit_cuda.driver import tensormap_args
from habu.emit_cuda.launcher_c import c_name
from habu.emit_cuda.standalone import slots_rule
from habu.export import export_bundle
from habu.lower.access import with_derived
from habu.paths.emit import emit
from habu.spec.parser import load_program, parse_text
from habu.target import target_named
from tests.conftest import ROOT

SM90 = target_named("sm_90a")
SM_COUNT, BLOCKS_PER_SM, CLUSTERS = 132, 2, 60  # what the stand-in driver answers
RUNTIME_K = (ROOT / "examples" / "ggemm.habu").read_text().replace("4096 EXTENT: #K", "1..65536 EXTENT: #K")
# a column max split over row blocks at a runtime width: each tile's counters, a workspace ("N/128" slots)
COLUMN_MAX = ("300 EXTENT: #R  8..4096%8 EXTENT: #N\nbf16 TENSOR: dY ( #R #N )  f32 TENSOR: G ( #N )\n"
              "MODEL: COLS  G[n] = max r dY[r n] ;\n")

MOCK = r"""
#include <stdio.h>
#include <string.h>
#include <cuda.h>

struct fn { char name[256]; };
static struct fn functions[64];
static int n_functions = 0;
static unsigned long long next_alloc = 0x7000000000ULL, encodes = 0;

CUresult cuModuleLoadData(CUmodule* m, const void* image) { (void)image; *m = (CUmodule)0x1; return CUDA_SUCCESS; }
CUresult cuModuleUnload(CUmodule m) { (void)m; return CUDA_SUCCESS; }
CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  (void)m; strncpy(functions[n_functions].name, name, 255); *f = (CUfunction)&functions[n_functions++];
  return CUDA_SUCCESS;
}
CUresult cuCtxGetDevice(CUdevice* d) { *d = 0; return CUDA_SUCCESS; }
CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  (void)d;
  if (a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) *v = SM_COUNT;
  else if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) *v = 9;
  else if (a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) *v = 0;
  else return CUDA_ERROR_INVALID_VALUE;
  return CUDA_SUCCESS;
}
CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  printf("attribute %s %d %d\n", ((struct fn*)f)->name, (int)a, v); return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f, int threads, size_t smem) {
  (void)f; (void)threads; (void)smem; *n = BLOCKS_PER_SM; return CUDA_SUCCESS;
}
CUresult cuOccupancyMaxActiveClusters(int* n, CUfunction f, const CUlaunchConfig* c) {
  (void)f; (void)c; *n = CLUSTERS; return CUDA_SUCCESS;
}
CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, void* address,
                                const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                                CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill oob) {
  memset(map, 0, sizeof *map);
  ((unsigned long long*)map)[0] = ++encodes;
  printf("encode %llu %d %u %llu dims", encodes, (int)dtype, rank, (unsigned long long)address);
  for (cuuint32_t i = 0; i < rank; ++i) printf(" %llu", (unsigned long long)dims[i]);
  printf(" strides");
  for (cuuint32_t i = 0; i + 1 < rank; ++i) printf(" %llu", (unsigned long long)strides[i]);
  printf(" box");
  for (cuuint32_t i = 0; i < rank; ++i) printf(" %u", box[i]);
  for (cuuint32_t i = 0; i < rank; ++i) if (element_strides[i] != 1) printf(" ELEMENT-STRIDE");
  printf(" swizzle %d %d %d %d\n", (int)swizzle, (int)interleave, (int)l2, (int)oob);
  return CUDA_SUCCESS;
}
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) {
  (void)s; printf("memset %llu %d %zu\n", (unsigned long long)p, v, n); return CUDA_SUCCESS;
}
CUresult cuMemAllocAsync(CUdeviceptr* p, size_t n, CUstream s) {
  (void)s; *p = next_alloc; printf("alloc %llu %zu\n", next_alloc, n); next_alloc += (n + 4095) / 4096 * 4096;
  return CUDA_SUCCESS;
}
CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) { (void)s; printf("free %llu\n", (unsigned long long)p); return CUDA_SUCCESS; }

static void print_params(const char* name, void** params);
static void print_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned smem,
                         int early, void** params) {
  const char* name = ((struct fn*)f)->name;
  printf("launch %s %u %u %u %u %u %d", name, gx, gy, gz, bx, smem, early);
  print_params(name, params);
  printf("\n");
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned smem, CUstream s, void** params, void** extra) {
  (void)by; (void)bz; (void)s; (void)extra; print_launch(f, gx, gy, gz, bx, smem, 0, params); return CUDA_SUCCESS;
}
CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  (void)extra;
  int early = c->numAttrs == 1 && c->attrs[0].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
              && c->attrs[0].value.programmaticStreamSerializationAllowed == 1;
  print_launch(f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX, c->sharedMemBytes, early ? 1 : -1, params);
  return CUDA_SUCCESS;
}
"""


def _toolchain() -> Path:
    include = Path("/usr/local/cuda/include")
    if not (include / "cuda.h").is_file() or shutil.which("gcc") is None:
        pytest.skip("needs cuda.h and gcc")
    from habu.emit_cuda.nvrtc import _nvrtc

    if _nvrtc() is None:
        pytest.skip("needs NVRTC")
    return include


def _params_table(kernels) -> str:
    """print_params: each parameter's 8 bytes (a pointer or a size) or its tensor map's encode number."""
    out = ["static void print_params(const char* name, void** params) {"]
    for k in kernels:
        kinds = "".join("t" if p.kind == "tensormap" else "v" for p in k.params)
        out.append(f'  if (!strcmp(name, "{k.name}")) {{ const char* kinds = "{kinds}";')
        out.append("    for (int i = 0; kinds[i]; ++i) { printf(\" %llu\", *(unsigned long long*)params[i]); }")
        out.append("    return; }")
    out += ['  printf(" UNKNOWN-KERNEL");', "}"]
    return "\n".join(out)


ADDRESS = 0x100000000  # tensor i lives at ADDRESS * (i + 1): aligned for every need


def run_launcher(tmp: Path, compiled, sizes: dict[str, int], offsets: dict[str, int] | None = None
                 ) -> tuple[list[str], dict]:
    include = _toolchain()
    files = export_bundle([(compiled, SM90)], tmp)
    import json

    desc = json.loads(next(f for f in files if f.suffix == ".json").read_text())
    kernels = [k for p in compiled.proofs for k in emit(p, SM90).kernels]
    mock = MOCK.replace("SM_COUNT", str(SM_COUNT)).replace("BLOCKS_PER_SM", str(BLOCKS_PER_SM)) \
        .replace("CLUSTERS;", f"{CLUSTERS};")
    (tmp / "mock.c").write_text(mock.replace("static void print_params(const char* name, void** params);",
                                             "static void print_params(const char* name, void** params);\n")
                                + _params_table(kernels) + "\n")
    fn = c_name(desc["model"])
    args = [f"(CUdeviceptr){ADDRESS * (i + 1) + (offsets or {}).get(t['name'], 0)}ULL"
            for i, t in enumerate(desc["tensors"])]
    args += [str(sizes[e]) for e in desc["runtime_extents"]] + ["(CUstream)0"]
    (tmp / "main.c").write_text(f'#include <stdio.h>\n#include "{fn[5:]}.h"\nint main(void) {{\n'
                                f'  printf("status %d\\n", (int){fn}({", ".join(args)}));\n  return 0;\n}}\n')
    r = subprocess.run(["gcc", "-std=c99", "-Wall", "-Werror", "-o", "run", "main.c", f"{fn[5:]}.c", "mock.c",
                        f"-I{include}"], cwd=tmp, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = subprocess.run([str(tmp / "run")], capture_output=True, text=True, timeout=60, check=True).stdout
    return out.splitlines(), desc


def expected_calls(compiled, desc, sizes: dict[str, int]) -> list[str]:
    """What CompiledModel would do, as the stand-in prints it (allocations and intermediates aside)."""
    kernel_set = compiled_kernel_set(compiled, [emit(p, SM90) for p in compiled.proofs])  # by bucket too
    all_sizes = {e.name: e.size for e in compiled.model.extents if e.size is not None} | sizes
    plan = kernel_set.select(all_sizes)
    tokens = [e for t in desc["tensors"] for e in t["extents"]] + [e for k in plan.kernels for p in k.params
                                                                    if p.tma for e in p.tma.dims]
    all_sizes = with_derived(all_sizes, tokens + [e for _, _, ext in plan.intermediates for e in ext])
    address = {t["name"]: ADDRESS * (i + 1) for i, t in enumerate(desc["tensors"])}
    shapes = {t["name"]: (t["extents"], t["dtype"]) for t in desc["tensors"]}
    shapes |= {name: (ext, dtype) for name, dtype, ext in plan.intermediates}
    lines, encodes, after_kernel = [], 0, False
    for k in plan.kernels:
        for z in k.zero:
            ext, dtype = shapes[z]
            n = ELEMENT_BYTES[dtype]
            for e in ext:
                n *= all_sizes[e]
            lines.append(f"memset {address.get(z, '?')} 0 {n}")  # '?': a workspace the launcher allocates
            after_kernel = False
        rule = slots_rule(k)
        slots = {None: SM_COUNT, "sm_count": SM_COUNT, "occupancy": BLOCKS_PER_SM * SM_COUNT,
                 "clusters": CLUSTERS * k.cluster}[rule]
        grid = k.grid(all_sizes, slots)
        smem = k.dynamic_smem(all_sizes)
        values = []
        for p in k.params:
            if p.kind == "tensormap":
                assert p.tma is not None
                ext, dtype = shapes[p.tma.tensor]
                shape = tuple(all_sizes[e] for e in ext)
                encodes += 1
                values.append(str(encodes))
                if p.tma.tensor not in address:
                    continue  # an intermediate: its address is the stand-in's allocation
                a = tensormap_args(p.tma, ArrayInfo(address[p.tma.tensor], shape, row_major(shape), dtype, 0),
                                   all_sizes)
                lines.append(f"encode {encodes} addr {a.address} dims {' '.join(map(str, a.dims))} strides "
                             f"{' '.join(map(str, a.strides))} box {' '.join(map(str, a.box))} swizzle {a.swizzle}")
            elif p.kind == "ptr":
                values.append(str(address.get(p.tensor, "?")))
            else:
                values.append(str(all_sizes[p.extent]))
        early = int(after_kernel and k.waits_for_previous and SM90.programmatic_launch)
        lines.append(f"launch {k.name} {' '.join(map(str, grid))} {k.threads} {smem} {early} {' '.join(values)}")
        after_kernel = True
    return lines


SWIZZLE_ENUM = {"NONE": 0, "32B": 1, "64B": 2, "128B": 3}


def normalise(lines: list[str], allocated: set[int]) -> list[str]:
    """The stand-in's output in expected_calls' words: tensor maps by dims/strides/box/swizzle name,
    parameters that point into the launcher's own allocations as '?'."""
    out = []
    for line in lines:
        w = line.split()
        if w[0] == "encode":
            if int(w[4]) in allocated:
                continue
            sw = next(k for k, v in SWIZZLE_ENUM.items() if v == int(w[w.index("swizzle") + 1]))
            body = " ".join(w[5:w.index("swizzle")])
            out.append(f"encode {w[1]} addr {w[4]} {body} swizzle {sw}")
        elif w[0] == "launch":
            out.append(" ".join(w[:8] + ["?" if x.isdigit() and int(x) in allocated else x for x in w[8:]]))
        elif w[0] == "memset":
            out.append(" ".join(["memset", "?" if int(w[1]) in allocated else w[1], *w[2:]]))
    return out


CASES = [
    ("runtime-k-tma-512", None, (), (("B", "tma"),), {"K": 512}),  # the guarded member
    ("runtime-k-tma-511", None, (), (("B", "tma"),), {"K": 511}),  # the fallback
    ("persistent", "ggemm.habu", (("M", 2048), ("N", 2048), ("K", 256)),
     (("persistent", "true"), ("tile", "128x128x64"), ("split_k", "1")), {}),
    ("persistent-cluster", "ggemm.habu", (("M", 2048), ("N", 1024), ("K", 256)),
     (("persistent", "true"), ("cluster", "2"), ("B", "tma"), ("split_k", "1"), ("tile", "128x128x64")), {}),
    ("split-k-staged", "ggemm.habu", (("M", 128), ("N", 128), ("K", 511)), (("split_k", "2"),), {}),
    ("rmsnorm-linear", "rmsnorm_linear.habu", (("T", 128), ("D", 256), ("N", 256)), (), {}),
    ("softmax-prefetch", "softmax.habu", (("R", 1500), ("C", 2048)),
     (("row_prefetch", "true"), ("cache_row", "true"), ("threads", "256")), {}),
    ("ffn-skip", "ffn_skip.habu", (("D", 256), ("H", 512)), (), {}),
    ("column-counters", COLUMN_MAX, (), (("rows_per_split", "64"), ("threads", "64"), ("column_threads", "32"),
                                         ("vector", "4")), {"N": 1000}),
]


@pytest.mark.parametrize("width", [256, 768, 4352, 8192, 65536])
def test_launcher_runs_the_kernel_of_the_size_bucket(width, tmp_path):
    """A bucketed runtime width (habu/plan/buckets.py): the C launcher picks the bucket's member by its
    range guards, the member `habu.build`'s table lookup picks."""
    program = load_program(ROOT / "examples" / "rmsnorm.habu")
    compiled = compile_model(program, "RMSNORM-ROWS", {"R": 64}, SM90, {}, trials=1)
    lines, desc = run_launcher(tmp_path, compiled, {"D": width})
    assert lines[-1] == "status 0", lines
    allocated = {int(w[1]) for w in (line.split() for line in lines) if w[0] == "alloc"}
    assert normalise(lines, allocated) == expected_calls(compiled, desc, {"D": width})
    bucket = next(i for i, p in enumerate(compiled.plans) if p.ranges[0][1] <= width <= p.ranges[0][2])
    assert any(compiled.plans[bucket].key[:8] in line for line in lines if line.startswith("launch"))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_launcher_makes_the_runtimes_launches(case, tmp_path):
    _, example, shape, pins, sizes = case
    program = (parse_text(RUNTIME_K, "g.habu") if example is None else parse_text(example, "c.habu")
               if "MODEL:" in example else load_program(ROOT / "examples" / example))
    compiled = compile_model(program, program.pick(None).name, dict(shape), SM90, dict(pins), trials=1)
    lines, desc = run_launcher(tmp_path, compiled, sizes)
    assert lines[-1] == "status 0", lines
    allocated = {int(w[1]) for w in (line.split() for line in lines) if w[0] == "alloc"}
    freed = {int(w[1]) for w in (line.split() for line in lines) if w[0] == "free"}
    assert allocated == freed
    assert all(" ELEMENT-STRIDE" not in line for line in lines)
    assert all(line.split()[-3:] == ["0", "2", "0"] for line in lines if line.startswith("encode"))  # no
    # interleave, L2 promotion 128 B, out-of-bounds elements read as zero: the runtime's settings
    expect = expected_calls(compiled, desc, sizes)
    assert normalise(lines, allocated) == expect


def test_launcher_refuses_sizes_outside_the_extent(tmp_path):
    compiled = compile_model(parse_text(RUNTIME_K, "g.habu"), "GGEMM", {}, SM90, {"B": "tma"}, trials=1)
    lines, _ = run_launcher(tmp_path, compiled, {"K": 65537})
    assert lines == ["status 1"]  # CUDA_ERROR_INVALID_VALUE, nothing launched


def test_launcher_refuses_a_pointer_the_chosen_member_cannot_use(tmp_path):
    """B loaded by TMA needs a 16-byte aligned base: the guarded member refuses B at +8 bytes (as the
    runtime's contract does), and nothing is launched."""
    compiled = compile_model(parse_text(RUNTIME_K, "g.habu"), "GGEMM", {}, SM90, {"B": "tma"}, trials=1)
    lines, desc = run_launcher(tmp_path, compiled, {"K": 512}, {"B": 8})
    assert next(t["member_align"] for t in desc["tensors"] if t["name"] == "B")[0] == 16
    assert lines == ["status 1"]
