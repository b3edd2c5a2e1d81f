"""The Python API: from a .habu file to a proven, compiled callable.

    import habu
    ggemm = habu.build("examples/ggemm.habu", K=511)       # prove, emit, compile (NVRTC)
    out = ggemm(A=a, B=b, IX=ix)                             # torch / cupy / any DLPack or CAI arrays

A model with runtime extents becomes a checked kernel set: each member carries the guards under
which its proof holds, and every call picks the first member whose guards hold for its shapes.
"""

from __future__ import annotations

from pathlib import Path

from habu.target import DEFAULT_TARGET, target_named


def current_target() -> str:
    """The target of GPU 0, or the default when there is no GPU."""
    try:
        from habu.bench.run import device_target

        return device_target()
    except Exception:
        return DEFAULT_TARGET


def build(path: str | Path, model: str | None = None, *, target: str | None = None,
          pins: dict[str, str] | None = None, trials: int = 3, **shape: int):
    """Prove the default (or pinned) plan for `model`, emit it and return a `CompiledModel`."""
    from habu.cli import pick_model
    from habu.compile import compile_model
    from habu.emit_cuda.emit import emit_plan
    from habu.emit_cuda.guards import KernelSet
    from habu.emit_cuda.runtime import CompiledModel
    from habu.spec.parser import load_program

    program = load_program(path)
    m = pick_model(program, model)
    tgt = target_named(target or current_target())
    compiled = compile_model(program, m.name, dict(shape), tgt, dict(pins or {}), trials)
    members = [(plan.guards, emit_plan(compiled.model, plan, tgt)) for plan in compiled.plans]
    return CompiledModel(compiled.model, KernelSet(members), arch=tgt.name)
