"""The C launcher of an exported kernel set: what `CompiledModel.__call__` does, over the CUDA driver API.

`habu export` writes a header declaring one function per model,

    CUresult habu_<model>(CUdeviceptr <inputs...>, CUdeviceptr <outputs...>, int64_t <runtime extents...>,
                          CUstream stream);

and a C file defining it from the launch description (`standalone.describe`) and the members' cubins:
it checks the runtime extents against their declared ranges, picks the first member whose guards
hold, checks the base-address alignment that member needs, loads the member's embedded cubin in the
current context (cuModuleLoadData, once), allocates the intermediates in stream order, zero-fills
what split-K adds into, encodes the tensor maps (cuTensorMapEncodeTiled with the runtime's settings)
and launches every kernel in order with its grid, block and dynamic shared memory (opting in above
48 KiB), early (programmatic stream serialization) where the runtime would. Index-tensor values are
not read on the host: the kernels mask a value out of range and record it in their module's error
words (`habu_index_errors`, habu/memory/index.cuh), which the caller may read with cuModuleGetGlobal.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from habu.emit_cuda.arrays import ELEMENT_BYTES
from habu.emit_cuda.driver import DEFAULT_SMEM_LIMIT, SWIZZLES, TMA_DTYPES
from habu.emit_cuda.guards import parse_guard

_C_COMPARE = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_C_ARITH = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}


def ptr(tensor: str) -> str:
    """The C variable of a tensor's device pointer (intermediates are named like %3, a kernel's counters
    like $G)."""
    return "p_" + "".join(ch if ch.isalnum() or ch == "_" else "tmp" if ch == "%" else "ws" if ch == "$" else "_"
                          for ch in tensor)


def c_name(model: str) -> str:
    return "habu_" + "".join(ch if ch.isalnum() else "_" for ch in model.lower())


def _guard_c(node: ast.expr, static: Mapping[str, int]) -> str:
    """A guard (z3's text, see guards.py) as C over the runtime extents (z3's div/mod for / and %)."""
    if isinstance(node, ast.Constant):
        return str(int(node.value))
    if isinstance(node, ast.Name):
        return f"{static[node.id]}LL" if node.id in static else node.id
    if isinstance(node, ast.BinOp):
        a, b = _guard_c(node.left, static), _guard_c(node.right, static)
        if type(node.op) in _C_ARITH:
            return f"({a} {_C_ARITH[type(node.op)]} {b})"
        fn = "habu_mod" if isinstance(node.op, ast.Mod) else "habu_div"
        return f"{fn}({a}, {b})"
    if isinstance(node, ast.UnaryOp):
        op = "!" if isinstance(node.op, ast.Not) else "-" if isinstance(node.op, ast.USub) else "+"
        return f"({op}{_guard_c(node.operand, static)})"
    if isinstance(node, ast.BoolOp):
        op = " && " if isinstance(node.op, ast.And) else " || "
        return "(" + op.join(_guard_c(v, static) for v in node.values) + ")"
    if isinstance(node, ast.Compare):
        terms = [node.left, *node.comparators]
        parts = [f"({_guard_c(a, static)} {_C_COMPARE[type(op)]} {_guard_c(b, static)})"
                 for a, op, b in zip(terms, node.ops, terms[1:], strict=False)]
        return "(" + " && ".join(parts) + ")"
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    args = [_guard_c(a, static) for a in node.args]
    name = node.func.id
    if name in ("And", "Or"):
        return "(" + (" && " if name == "And" else " || ").join(args) + ")"
    if name == "Not":
        return f"(!{args[0]})"
    if name == "Implies":
        return f"(!{args[0]} || {args[1]})"
    return f"({args[0]} ? {args[1]} : {args[2]})"


def guard_c(text: str, static: Mapping[str, int]) -> str:
    return _guard_c(parse_guard(text), static)


def _formula(text: str) -> str:
    """A grid formula of standalone.py (C already) with Habu's min/max helpers."""
    return text.replace("min((long long)", "habu_min((long long)").replace("max((long long)", "habu_max((long long)")


def _size(token: str, static: Mapping[str, int]) -> str:
    """An extent's size in C: a number, a runtime extent's variable or a derived "K^8" or "N/256"."""
    if "^" in token:
        base, multiple = token.split("^")
        return f"(({_size(base, static)} + {int(multiple) - 1}) / {multiple} * {multiple})"
    if "/" in token:
        base, tile = token.split("/")
        return f"(({_size(base, static)} + {int(tile) - 1}) / {tile})"
    return f"{static[token]}LL" if token in static else token


def _numel(extents: Sequence[str], static: Mapping[str, int]) -> str:
    return " * ".join(f"(size_t){_size(e, static)}" for e in extents) or "(size_t)1"


def _bytes_array(name: str, data: bytes) -> str:
    rows = [", ".join(f"0x{b:02x}" for b in data[i:i + 16]) for i in range(0, len(data), 16)]
    return f"static const unsigned char {name}[{len(data)}] __attribute__((aligned(64))) = {{\n  " + \
        ",\n  ".join(rows) + "\n};\n"


def signature(desc: Mapping[str, Any], named: bool = True) -> str:
    """The launcher's parameter list: the tensors in order, the runtime extents, the stream."""
    parts = [f"CUdeviceptr {t['name'] if named else ptr(t['name'])}" for t in desc["tensors"]]
    parts += [f"int64_t {e}" for e in desc["runtime_extents"]]
    return ", ".join([*parts, "CUstream stream"])


def header(descs: Sequence[Mapping[str, Any]]) -> str:
    """The C header of an exported model (one description per target, same tensors)."""
    desc = descs[0]
    fn = c_name(desc["model"])
    guard = fn.upper() + "_H"
    doc = [f"{fn}: {desc['model']} on {', '.join(d['target'] for d in descs)} (Habu export; the part for the",
           "current device's compute capability runs, CUDA_ERROR_NO_BINARY_FOR_GPU elsewhere).", "",
           "Arguments, in order: device pointers to the tensors (row-major, contiguous),"]
    for i, t in enumerate(desc["tensors"]):
        dims = " ".join(f"#{e}" for e in t["extents"])
        extra = f", values in 0..#{t['index_range']}-1" if t["index_range"] else ""
        align = max(d["tensors"][i]["align"] for d in descs)
        doc.append(f"  {t['name']}: {t['role']}, {t['dtype']} ( {dims} ){extra}, base aligned to {align} B")
    if desc["runtime_extents"]:
        doc.append("then the runtime extents: " + ", ".join(desc["runtime_extents"]) + ",")
    doc.append("then the stream. The CUDA context of the pointers must be current. Returns CUDA_SUCCESS,")
    doc.append("CUDA_ERROR_INVALID_VALUE for sizes outside the declared extents or misaligned pointers,")
    doc.append("or the driver's error. Static extents: " + (", ".join(
        f"#{k} = {v}" for k, v in desc["static_extents"].items()) or "none") + ".")
    body = "\n".join((" * " + line).rstrip() for line in doc)
    return (f"#ifndef {guard}\n#define {guard}\n\n#include <stdint.h>\n#include <cuda.h>\n\n"
            f"#ifdef __cplusplus\nextern \"C\" {{\n#endif\n\n/*\n{body}\n */\n"
            f"CUresult {fn}({signature(desc)});\n\n"
            f"/* Unloads the modules {fn} loaded (in the context current at the first call). */\n"
            f"void {fn}_unload(void);\n\n"
            f"#ifdef __cplusplus\n}}\n#endif\n\n#endif /* {guard} */\n")


_PRELUDE = """\
#define HABU_CHECK(call) do { CUresult habu_err_ = (call); if (habu_err_ != CUDA_SUCCESS) return habu_err_; } while (0)

static inline long long habu_min(long long a, long long b) { return a < b ? a : b; }
static inline long long habu_max(long long a, long long b) { return a > b ? a : b; }
/* z3's integer division and remainder (the remainder is never negative), as the guards use them */
static inline long long habu_mod(long long a, long long b) { long long r = a % (b < 0 ? -b : b); return r < 0 ? r + (b < 0 ? -b : b) : r; }
static inline long long habu_div(long long a, long long b) { return (a - habu_mod(a, b)) / b; }

static inline CUresult habu_encode(CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, CUdeviceptr address,
                                   const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                   CUtensorMapSwizzle swizzle) {
  const cuuint32_t ones[5] = {1, 1, 1, 1, 1};
  return cuTensorMapEncodeTiled(map, dtype, rank, (void*)address, dims, strides, box, ones,
                                CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
}

static inline CUresult habu_launch(CUfunction f, long long gx, long long gy, long long gz, unsigned threads,
                                   unsigned smem, CUstream stream, void** args, int early) {
  if (!early)
    return cuLaunchKernel(f, (unsigned)gx, (unsigned)gy, (unsigned)gz, threads, 1, 1, smem, stream, args, NULL);
  CUlaunchConfig config;
  CUlaunchAttribute attribute;
  memset(&config, 0, sizeof config);
  memset(&attribute, 0, sizeof attribute);
  config.gridDimX = (unsigned)gx; config.gridDimY = (unsigned)gy; config.gridDimZ = (unsigned)gz;
  config.blockDimX = threads; config.blockDimY = 1; config.blockDimZ = 1;
  config.sharedMemBytes = smem;
  config.hStream = stream;
  attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
  attribute.value.programmaticStreamSerializationAllowed = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return cuLaunchKernelEx(&config, f, args, NULL);
}
"""


def _slots(k: Mapping[str, Any], fn: str, smem: str) -> list[str]:
    rule = k["slots"]
    if rule is None:
        return []
    if rule == "sm_count":
        return ["long long SLOTS = sm_count;"]
    if rule == "occupancy":
        return ["int per_sm = 0;",
                f"HABU_CHECK(cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, {fn}, {k['block'][0]}, {smem}));",
                "long long SLOTS = (long long)per_sm * sm_count;",
                "if (SLOTS < 1) return CUDA_ERROR_INVALID_VALUE;"]
    return ["CUlaunchConfig occupancy;", "int clusters = 0;", "memset(&occupancy, 0, sizeof occupancy);",
            f"occupancy.gridDimX = {k['cluster']} * (unsigned)sm_count; occupancy.gridDimY = 1; "
            "occupancy.gridDimZ = 1;",
            f"occupancy.blockDimX = {k['block'][0]}; occupancy.blockDimY = 1; occupancy.blockDimZ = 1;",
            f"occupancy.sharedMemBytes = {smem};",
            f"HABU_CHECK(cuOccupancyMaxActiveClusters(&clusters, {fn}, &occupancy));",
            f"long long SLOTS = (long long)clusters * {k['cluster']};",
            "if (SLOTS < 1) return CUDA_ERROR_INVALID_VALUE;"]


def _kernel(k: Mapping[str, Any], fn: str, extents_of: Mapping[str, Sequence[str]], dtype_of: Mapping[str, str],
            static: Mapping[str, int], early_ok: bool) -> list[str]:
    """The launch of one kernel, in its own block."""
    out = ["{"]
    for z in k["zero_first"]:
        nbytes = f"{_numel(extents_of[z], static)} * {ELEMENT_BYTES[dtype_of[z]]}"
        out += [f"  HABU_CHECK(cuMemsetD8Async({ptr(z)}, 0, {nbytes}, stream));", "  after_kernel = 0;"]
    smem = k["dynamic_smem"]
    per = smem.get("per_extent")
    smem_c = f"{smem['bytes']}" + (f" + {per['bytes']} * {_size(per['extent'], static)}" if per else "")
    out.append(f"  const unsigned smem = (unsigned)({smem_c});")
    out.append(f"  if (smem > {DEFAULT_SMEM_LIMIT}) HABU_CHECK(cuFuncSetAttribute({fn}, "
               "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)smem));")
    out += ["  " + line for line in _slots(k, fn, "smem")]
    gx, gy, gz = (_formula(g) for g in k["grid"])
    out.append(f"  const long long gx = {gx}, gy = {gy}, gz = {gz};")
    out.append("  if (gx > 0 && gy > 0 && gz > 0) {")
    values = []
    for p in k["params"]:
        if p["kind"] == "ptr":
            values.append(f"&{ptr(p['tensor'])}")
        elif p["kind"] == "size":
            out.append(f"    long long s_{p['name']} = {_size(p['extent'], static)};")
            values.append(f"&s_{p['name']}")
        else:
            t = next(m for m in k["tensor_maps"] if m["param"] == p["name"])
            rank = len(t["dims"])
            shape = [_size(e, static) for e in extents_of[t["tensor"]]]  # outermost first
            elt = ELEMENT_BYTES[t["dtype"]]
            strides = []  # bytes, dims 1.. innermost first: the row-major stride of dim rank-1-i
            for i in range(1, rank):
                strides.append(" * ".join([f"(cuuint64_t){s}" for s in shape[rank - i:]] + [str(elt)]))
            name = "map_" + p["name"]
            out.append(f"    CUtensorMap {name};")
            out.append(f"    const cuuint64_t {name}_dims[{rank}] = {{"
                       + ", ".join(f"(cuuint64_t){_size(e, static)}" for e in t["dims"]) + "};")
            out.append(f"    const cuuint64_t {name}_strides[{max(1, rank - 1)}] = {{" + (", ".join(strides) or "0")
                       + "};")
            out.append(f"    const cuuint32_t {name}_box[{rank}] = {{" + ", ".join(map(str, t["box"])) + "};")
            out.append(f"    HABU_CHECK(habu_encode(&{name}, CU_TENSOR_MAP_DATA_TYPE_{TMA_DTYPES[t['dtype']]}, "
                       f"{rank}, {ptr(t['tensor'])}, {name}_dims, {name}_strides, {name}_box, "
                       f"CU_TENSOR_MAP_SWIZZLE_{SWIZZLES[t['swizzle']]}));")
            values.append(f"&{name}")
    out.append(f"    void* args[{max(1, len(values))}] = {{" + (", ".join(values) or "NULL") + "};")
    early = "after_kernel" if (k["programmatic_launch"] and early_ok) else "0"
    out.append(f"    HABU_CHECK(habu_launch({fn}, gx, gy, gz, {k['block'][0]}, smem, stream, args, {early}));")
    out += ["    after_kernel = 1;", "  }", "}"]
    return out


@dataclass(frozen=True)
class TargetBuild:
    """One target's part of a bundle: its launch description, each member's cubin, whether its kernels
    may launch early (programmatic dependent launch) and the compute capability it runs on."""

    desc: Mapping[str, Any]
    cubins: tuple[bytes, ...]
    programmatic_launch: bool
    capability: tuple[int, int]


def _section(build: TargetBuild, fn: str) -> list[str]:
    """One target's embedded cubins, modules, member launches and its member choice `{fn}` (the guards)."""
    desc = build.desc
    static = desc["static_extents"]
    out = [f"/* ---- {desc['target']} (compute capability {build.capability[0]}.{build.capability[1]}) */", ""]
    for i, data in enumerate(build.cubins):
        out.append(_bytes_array(f"{fn}_cubin{i}", data))
    for i, member in enumerate(desc["members"]):
        out.append(f"static CUmodule {fn}_module{i} = NULL;")
        out.append(f"static CUfunction {fn}_functions{i}[{len(member['kernels'])}];")
    out.append("")
    out.append(f"static void {fn}_unload(void) {{")
    for i in range(len(desc["members"])):
        out.append(f"  if ({fn}_module{i}) {{ cuModuleUnload({fn}_module{i}); {fn}_module{i} = NULL; }}")
    out += ["}", ""]
    for i, member in enumerate(desc["members"]):
        extents_of = {t["name"]: t["extents"] for t in (*desc["tensors"], *member["intermediates"])}
        dtype_of = {t["name"]: t["dtype"] for t in (*desc["tensors"], *member["intermediates"])}
        out.append(f"static CUresult {fn}_member{i}_kernels({_kernels_signature(desc, member)}) {{")
        out.append("  int after_kernel = 0;  /* the stream's last operation was this member's previous kernel */")
        out.append("  " + " ".join(f"(void){a};" for a in _call_args(desc, member)))
        for j, k in enumerate(member["kernels"]):
            out += ["  " + line for line in _kernel(k, f"{fn}_functions{i}[{j}]", extents_of, dtype_of, static,
                                                     build.programmatic_launch)]
        out += ["  (void)after_kernel;", "  return CUDA_SUCCESS;", "}", ""]
        out.append(f"static CUresult {fn}_member{i}({signature(desc, named=False)}) {{")
        for t in desc["tensors"]:
            if t["member_align"][i] > 1:
                out.append(f"  if ({ptr(t['name'])} % {t['member_align'][i]}) return CUDA_ERROR_INVALID_VALUE;")
        out.append(f"  if (!{fn}_module{i}) {{")
        out.append("    CUmodule module;")
        out.append(f"    HABU_CHECK(cuModuleLoadData(&module, {fn}_cubin{i}));")
        for j, k in enumerate(member["kernels"]):
            out.append(f"    HABU_CHECK(cuModuleGetFunction(&{fn}_functions{i}[{j}], module, \"{k['name']}\"));")
        out += [f"    {fn}_module{i} = module;", "  }"]
        out += ["  CUdevice device;", "  int sm_count = 0;", "  HABU_CHECK(cuCtxGetDevice(&device));",
                "  HABU_CHECK(cuDeviceGetAttribute(&sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device));"]
        for t in member["intermediates"]:
            nbytes = f"{_numel(t['extents'], static)} * {ELEMENT_BYTES[t['dtype']]}"
            out.append(f"  CUdeviceptr {ptr(t['name'])} = 0;")
            out.append(f"  HABU_CHECK(cuMemAllocAsync(&{ptr(t['name'])}, ({nbytes}) > 0 ? ({nbytes}) : 1, stream));")
        out.append(f"  CUresult status = {fn}_member{i}_kernels({', '.join(_call_args(desc, member))});")
        for t in member["intermediates"]:
            out.append(f"  {{ CUresult e = cuMemFreeAsync({ptr(t['name'])}, stream); "
                       "if (status == CUDA_SUCCESS) status = e; }")
        out += ["  return status;", "}", ""]
    out.append(f"static CUresult {fn}({signature(desc, named=False)}) {{")
    call = ", ".join([ptr(t["name"]) for t in desc["tensors"]] + list(desc["runtime_extents"]) + ["stream"])
    for i, member in enumerate(desc["members"]):
        cond = " && ".join(guard_c(g, static) for g in member["guards"]) or "1"
        out.append(f"  if ({cond}) return {fn}_member{i}({call});")
    out += ["  return CUDA_ERROR_INVALID_VALUE;  /* no member of the kernel set accepts these sizes */", "}", ""]
    return out


def _target_suffix(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def source(builds: Sequence[TargetBuild], header_name: str) -> str:
    """The C launcher: each target's embedded cubins and members, and the public entry point, which
    checks the runtime extents and runs the part for the current device's compute capability."""
    desc = builds[0].desc
    fn = c_name(desc["model"])
    targets = ", ".join(b.desc["target"] for b in builds)
    out = [f"/* {fn}: the launcher of {desc['model']} on {targets}, written by `habu export`. */",
           "#include <string.h>", f'#include "{header_name}"', "", _PRELUDE]
    for b in builds:
        out += _section(b, f"{fn}_{_target_suffix(b.desc['target'])}")
    out.append(f"void {fn}_unload(void) {{")
    out += [f"  {fn}_{_target_suffix(b.desc['target'])}_unload();" for b in builds]
    out += ["}", ""]
    out.append(f"CUresult {fn}({signature(desc, named=False)}) {{")
    for name in desc["runtime_extents"]:
        e = desc["extent_ranges"][name]
        cond = f"{name} < {e['lo']}LL || {name} > {e['hi']}LL"
        if e["multiple"] > 1:
            cond += f" || {name} % {e['multiple']} != 0"
        out.append(f"  if ({cond}) return CUDA_ERROR_INVALID_VALUE;")
    out += ["  CUdevice device;", "  int major = 0, minor = 0;", "  HABU_CHECK(cuCtxGetDevice(&device));",
            "  HABU_CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device));",
            "  HABU_CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device));"]
    call = ", ".join([ptr(t["name"]) for t in desc["tensors"]] + list(desc["runtime_extents"]) + ["stream"])
    for b in builds:
        major, minor = b.capability
        out.append(f"  if (major == {major} && minor == {minor}) "
                   f"return {fn}_{_target_suffix(b.desc['target'])}({call});")
    out += [f"  return CUDA_ERROR_NO_BINARY_FOR_GPU;  /* exported for {targets} only */", "}", ""]
    return "\n".join(out)


def _kernels_signature(desc: Mapping[str, Any], member: Mapping[str, Any]) -> str:
    parts = [f"CUdeviceptr {ptr(t['name'])}" for t in (*desc["tensors"], *member["intermediates"])]
    parts += [f"int64_t {e}" for e in desc["runtime_extents"]]
    return ", ".join([*parts, "CUstream stream", "int sm_count"])


def _call_args(desc: Mapping[str, Any], member: Mapping[str, Any]) -> list[str]:
    return ([ptr(t["name"]) for t in (*desc["tensors"], *member["intermediates"])]
            + list(desc["runtime_extents"]) + ["stream", "sm_count"])


__all__ = ["TargetBuild", "c_name", "guard_c", "header", "signature", "source"]
