"""Kernels outside Python: `habu emit`'s standalone `.cu` and `habu export`'s ahead-of-time bundle.

    standalone(compiled, target)       -> a .cu that compiles alone (headers inlined) and its launch JSON
    export_bundle([(compiled, target), ...], d)
        -> d/<model>.<target>.m<i>.cubin, d/<model>.<target>.json, d/<model>.<target>.cu per target,
           and one d/<model>.h and d/<model>.c for all of them

The bundle's C file embeds the cubins and launches them over the CUDA driver API
(habu/emit_cuda/launcher_c.py); link it with `-lcuda`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from habu.compile import Compiled
from habu.target import Target


def _members(compiled: Compiled, target: Target) -> list[tuple[tuple[str, ...], str, Any]]:
    """Each plan's guards, key and kernels; a size bucket's plan (habu/plan/buckets.py) is guarded by
    its bucket's range too, so the launcher runs it only for the sizes it was proven for."""
    from habu.paths.emit import emit
    from habu.plan.buckets import range_guards

    return [(range_guards(proof.plan.ranges) + tuple(proof.plan.guards), proof.plan.key, emit(proof, target))
            for proof in compiled.proofs]


def standalone(compiled: Compiled, target: Target) -> tuple[str, dict[str, Any]]:
    """The CUDA of every member in one file that compiles with no include path, and its launch description."""
    from habu.emit_cuda.standalone import describe, standalone_source

    members = _members(compiled, target)
    desc = describe(compiled.model, target.name, members)
    kernels = [k for _, _, plan in members for k in plan.kernels]
    return standalone_source(desc, kernels), desc


def bundle_stem(model_name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in model_name.lower())


def export_bundle(builds: Sequence[tuple[Compiled, Target]], out_dir: Path) -> list[Path]:
    """Compile every member for each (compiled plan, target) and write the bundle; the paths written.
    One header and one C launcher serve every target (the device's compute capability picks)."""
    from habu.emit_cuda.cache import compile_cached
    from habu.emit_cuda.launcher_c import TargetBuild, header, source
    from habu.emit_cuda.nvrtc import resources_of
    from habu.emit_cuda.standalone import describe, geometry_json, standalone_source

    stem = bundle_stem(builds[0][0].model.name)
    parts: list[TargetBuild] = []
    sources: list[str] = []
    for compiled, target in builds:
        members = _members(compiled, target)
        desc = describe(compiled.model, target.name, members)
        cubins: list[bytes] = []
        for i, (_guards, _key, plan) in enumerate(members):
            text = "\n".join(k.source for k in plan.kernels)
            cubin, _hit = compile_cached(text, f"{stem}_m{i}", target.name)
            for k in plan.kernels:
                k.check_registers(resources_of(cubin.log, k.name).registers)
            cubins.append(cubin.cubin)
        parts.append(TargetBuild(desc, tuple(cubins), target.programmatic_launch, target.compute_capability))
        sources.append(standalone_source(desc, [k for _, _, plan in members for k in plan.kernels]))
    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for part, text in zip(parts, sources, strict=True):
        name = part.desc["target"]
        for i, data in enumerate(part.cubins):
            p = out_dir / f"{stem}.{name}.m{i}.cubin"
            p.write_bytes(data)
            written.append(p)
        js = out_dir / f"{stem}.{name}.json"
        js.write_text(geometry_json(part.desc))
        cu = out_dir / f"{stem}.{name}.cu"
        cu.write_text(text)
        written += [js, cu]
    h = out_dir / f"{stem}.h"
    h.write_text(header([p.desc for p in parts]))
    c = out_dir / f"{stem}.c"
    c.write_text(source(parts, h.name))
    return [*written, h, c]


__all__ = ["bundle_stem", "export_bundle", "standalone"]
