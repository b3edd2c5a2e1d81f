"""Kernels outside Python: `habu emit`'s standalone `.cu` and `habu export`'s ahead-of-time bundle.

    standalone(compiled, target)       -> a .cu that compiles alone (headers inlined) and its launch JSON
    export_bundle(compiled, target, d) -> d/<model>.<target>.m<i>.cubin, d/<model>.h, d/<model>.c,
                                          d/<model>.json, d/<model>.cu

The bundle's C file embeds the cubins and launches them over the CUDA driver API
(habu/emit_cuda/launcher_c.py); link it with `-lcuda`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from habu.compile import Compiled
from habu.target import Target


def _members(compiled: Compiled, target: Target) -> list[tuple[tuple[str, ...], str, Any]]:
    from habu.emit_cuda.emit import emit

    return [(tuple(proof.plan.guards), proof.plan.key, emit(proof, target)) for proof in compiled.proofs]


def standalone(compiled: Compiled, target: Target) -> tuple[str, dict[str, Any]]:
    """The CUDA of every member in one file that compiles with no include path, and its launch description."""
    from habu.emit_cuda.standalone import describe, standalone_source

    members = _members(compiled, target)
    desc = describe(compiled.model, target.name, members)
    kernels = [k for _, _, plan in members for k in plan.kernels]
    return standalone_source(desc, kernels), desc


def bundle_stem(model_name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in model_name.lower())


def export_bundle(compiled: Compiled, target: Target, out_dir: Path) -> list[Path]:
    """Compile every member for `target` and write the bundle; the paths written."""
    from habu.emit_cuda.cache import compile_cached
    from habu.emit_cuda.launcher_c import header, source
    from habu.emit_cuda.nvrtc import resources_of
    from habu.emit_cuda.standalone import describe, geometry_json, standalone_source

    members = _members(compiled, target)
    desc = describe(compiled.model, target.name, members)
    stem = bundle_stem(compiled.model.name)
    cubins: list[bytes] = []
    for i, (_guards, _key, plan) in enumerate(members):
        text = "\n".join(k.source for k in plan.kernels)
        cubin, _hit = compile_cached(text, f"{stem}_m{i}", target.name)
        for k in plan.kernels:
            k.check_registers(resources_of(cubin.log, k.name).registers)
        cubins.append(cubin.cubin)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for i, data in enumerate(cubins):
        p = out_dir / f"{stem}.{target.name}.m{i}.cubin"
        p.write_bytes(data)
        written.append(p)
    h = out_dir / f"{stem}.h"
    h.write_text(header(desc))
    c = out_dir / f"{stem}.c"
    c.write_text(source(desc, cubins, h.name, target.programmatic_launch))
    js = out_dir / f"{stem}.json"
    js.write_text(geometry_json(desc))
    cu = out_dir / f"{stem}.cu"
    cu.write_text(standalone_source(desc, [k for _, _, plan in members for k in plan.kernels]))
    return [*written, h, c, js, cu]


__all__ = ["bundle_stem", "export_bundle", "standalone"]
