"""A `.cu` that compiles alone, and the launch geometry of its kernels.

The kernels Habu emits `#include "habu/habu.cuh"`; a file handed to `nvcc -cubin` or NVRTC with no
include path needs those device headers inside it. `standalone_source` inlines each header once, in
dependency order (the preprocessor conditionals of habu.cuh kept), each after a `// from habu/x.cuh`
marker, and puts the launch geometry of every kernel in a comment block at the top:

    name, grid (a C formula of the runtime extents and SLOTS, the blocks resident at once for a
    persistent kernel), block, dynamic shared memory, cluster, tensor maps (tensor, dtype, dims,
    box, swizzle), the parameters in order, the outputs zero-filled first and whether the kernel
    may be launched early (programmatic dependent launch).

`launch_geometry` is the same description as JSON-ready data (`habu emit` writes it beside the
`.cu`); `habu export` prints its C launcher from it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.geometry import geometry_for
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan
from habu.emit_cuda.nvrtc import INCLUDE_DIR
from habu.spec.ir import Model

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
ROOT_HEADER = "habu/habu.cuh"
SLOTS = "SLOTS"  # in a grid formula: blocks of the kernel resident at once (see `slots_rule`)


# ----------------------------------------------------------------------------- headers


def _inline(path: Path, seen: set[Path], out: list[str]) -> None:
    """`path` with its quoted includes replaced by the headers themselves, each header once."""
    path = path.resolve()
    if path in seen:
        return
    seen.add(path)
    out.append(f"// from {path.relative_to(INCLUDE_DIR).as_posix()}")
    for line in path.read_text().splitlines():
        if line.strip() == "#pragma once":
            continue
        m = _INCLUDE.match(line)
        if m:
            target = (path.parent / m.group(1)).resolve()
            if not target.is_file():
                raise FileNotFoundError(f"{path.name} includes {m.group(1)}, which is not in {INCLUDE_DIR}")
            _inline(target, seen, out)
            continue
        out.append(line)


def inlined_headers() -> str:
    """Habu's device headers as one block of source, each once, in dependency order."""
    out: list[str] = []
    _inline(INCLUDE_DIR / ROOT_HEADER, set(), out)
    return "\n".join(out) + "\n"


def without_habu_include(source: str) -> str:
    """A kernel's source without its `#include "habu/habu.cuh"` (the headers come inlined)."""
    return "\n".join(line for line in source.splitlines()
                     if not (_INCLUDE.match(line) and _INCLUDE.match(line).group(1) == ROOT_HEADER)) + "\n"


# ----------------------------------------------------------------------------- geometry


def _symbolic_sizes(kernel: CudaKernel, static: Mapping[str, int]) -> dict[str, Any]:
    """Every extent the kernel's lowering may ask for: a number when static, else its C name."""

    class Sizes(dict):
        def __missing__(self, name: str) -> Any:
            if "^" in name:  # a derived size: #K rounded up to a multiple
                base, multiple = name.split("^")
                m = int(multiple)
                return (self[base] + (m - 1)) // m * m
            return CExpr(name)

    return Sizes({k: int(v) for k, v in static.items()})


def _formula(x: Any) -> str:
    return c(x) if isinstance(x, CExpr | int) else str(x)


def grid_formula(kernel: CudaKernel, static: Mapping[str, int]) -> tuple[str, str, str]:
    """The grid as C expressions of the runtime extents (and SLOTS for persistent kernels): what
    `CudaKernel.grid` computes for concrete sizes, from the same lowering functions."""
    x, y, z = geometry_for(kernel.lowering).formula(kernel.lowering, _symbolic_sizes(kernel, static), CExpr(SLOTS))
    return _formula(x), _formula(y), _formula(z)


def slots_rule(kernel: CudaKernel) -> str | None:
    """How a persistent kernel's SLOTS is found on the device (None: the grid does not use it)."""
    return geometry_for(kernel.lowering).slots(kernel.lowering, kernel.cluster)


def launch_geometry(kernel: CudaKernel, static: Mapping[str, int]) -> dict[str, Any]:
    """One kernel's launch contract as JSON-ready data."""
    params = []
    for p in kernel.params:
        entry: dict[str, Any] = {"name": p.name, "kind": p.kind}
        if p.kind == "ptr":
            entry |= {"tensor": p.tensor, "dtype": p.dtype, "writes": p.writes}
        elif p.kind == "size":
            entry |= {"extent": p.extent, "ctype": "long long"}
        elif p.tma is not None:
            entry |= {"tensor": p.tma.tensor}
        params.append(entry)
    tmas = [{"param": p.name, "tensor": p.tma.tensor, "dtype": p.tma.dtype, "dims": list(p.tma.dims),
             "box": list(p.tma.box), "swizzle": p.tma.swizzle} for p in kernel.params if p.tma is not None]
    smem: dict[str, Any] = {"bytes": kernel.smem}
    if kernel.smem_per is not None:
        smem["per_extent"] = {"extent": kernel.smem_per[0], "bytes": kernel.smem_per[1]}
    return {"name": kernel.name, "grid": list(grid_formula(kernel, static)), "slots": slots_rule(kernel),
            "block": [kernel.threads, 1, 1], "dynamic_smem": smem, "cluster": kernel.cluster,
            "tensor_maps": tmas, "params": params, "zero_first": list(kernel.zero),
            "programmatic_launch": kernel.waits_for_previous}


def _comment(members: Sequence[dict[str, Any]], target: str) -> str:
    lines = [f"Habu kernels for {target}: compile alone with `nvcc -cubin -arch={target} FILE.cu` or NVRTC.",
             "Launch geometry (also in the .json beside this file). Sizes are the runtime extents as",
             "64-bit integers; SLOTS is the number of blocks of the kernel resident at once (persistent",
             "kernels). Launch the kernels of a member in order on one stream.", ""]
    for i, m in enumerate(members):
        guard = " and ".join(m["guards"]) or "always"
        lines.append(f"member {i} (plan {m['plan']}), used where {guard}:")
        for k in m["kernels"]:
            smem = k["dynamic_smem"]
            extra = (f" + {smem['per_extent']['bytes']} * {smem['per_extent']['extent']}"
                     if "per_extent" in smem else "")
            lines.append(f"  {k['name']}")
            lines.append(f"    grid ({', '.join(k['grid'])}), block ({', '.join(map(str, k['block']))}), "
                         f"dynamic smem {smem['bytes']}{extra} B, cluster {k['cluster']}"
                         + (f", SLOTS by {k['slots']}" if k["slots"] else ""))
            lines.append("    args: " + ", ".join(f"{p['name']} ({p['kind']})" for p in k["params"]))
            for t in k["tensor_maps"]:
                lines.append(f"    tensor map {t['param']}: {t['tensor']} {t['dtype']}, dims ({', '.join(t['dims'])}) "
                             f"innermost first, box ({', '.join(map(str, t['box']))}), swizzle {t['swizzle']} B")
            if k["zero_first"]:
                lines.append(f"    zero-fill first: {', '.join(k['zero_first'])}")
            if k["programmatic_launch"]:
                lines.append("    may launch early after the previous kernel (programmatic stream serialization)")
    return "/*\n" + "\n".join((" * " + line).rstrip() for line in lines) + "\n */\n"


def describe(model: Model, target: str, members: Sequence[tuple[Sequence[str], str, EmittedPlan]]) -> dict[str, Any]:
    """The JSON description of a model's kernel set (its members in the order they are tried:
    guards, plan key, kernels) and of the tensors the launch takes, in argument order."""
    from habu.emit_cuda.checks import contract_of

    static = {e.name: int(e.size) for e in model.extents if e.size is not None}
    contracts = [contract_of(model, plan) for _, _, plan in members]
    tensors = []
    for t in contracts[0].tensors:
        if t.role == "intermediate":
            continue
        aligns = [c.tensor(t.name).align for c in contracts]  # type: ignore[union-attr]
        tensors.append({"name": t.name, "role": t.role, "dtype": t.dtype, "extents": list(t.extents),
                        "align": max(aligns), "member_align": aligns, "index_range": t.index_range})
    return {"model": model.name, "target": target,
            "runtime_extents": [e.name for e in model.extents if e.size is None],
            "static_extents": static, "tensors": tensors,
            "extent_ranges": {e.name: {"lo": e.lo, "hi": e.hi, "multiple": e.multiple}
                              for e in model.extents if e.size is None},
            "members": [{"guards": list(g), "plan": key,
                         "intermediates": [{"name": t.name, "dtype": t.dtype, "extents": list(t.extents)}
                                           for t in contract.tensors if t.role == "intermediate" and t.used],
                         "kernels": [launch_geometry(k, static) for k in plan.kernels]}
                        for (g, key, plan), contract in zip(members, contracts, strict=True)]}


def standalone_source(description: Mapping[str, Any], kernels: Sequence[CudaKernel]) -> str:
    """One `.cu` with the geometry comment, Habu's headers inlined once and every kernel."""
    body = "\n".join(without_habu_include(k.source) for k in kernels)
    return (_comment(description["members"], description["target"]) + "\n" + inlined_headers() + "\n" + body)


def geometry_json(description: Mapping[str, Any]) -> str:
    return json.dumps(description, indent=2) + "\n"


__all__ = ["SLOTS", "describe", "geometry_json", "grid_formula", "inlined_headers", "launch_geometry",
           "slots_rule", "standalone_source", "without_habu_include"]
