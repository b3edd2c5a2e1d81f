"""`habu emit` and `habu export`: kernels outside Python (habu/export.py does the work)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from habu.cli_options import FileArg, MachineTargetOpt, PinOpt, ShapeOpt, parse_shape
from habu.errors import UsageError
from habu.targets import DEFAULT_TARGET, TARGETS


def emit(
    file: FileArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the CUDA source (a .cu file); "
                                                                "its launch geometry goes beside it as .json.")],
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
    target: MachineTargetOpt = None,
    pin: PinOpt = None,
) -> None:
    """Write the CUDA of the default (or pinned) plan, after proving it: one .cu that compiles alone
    (Habu's headers inlined, the launch geometry in a comment) and the geometry as JSON beside it."""
    from habu.cli_paths import output_file
    from habu.compile import compile_model
    from habu.emit_cuda.standalone import geometry_json
    from habu.export import standalone
    from habu.search.space import parse_pins
    from habu.spec.parser import load_program
    from habu.target import target_named

    output_file(output, "-o", suffix=".cu")
    geometry = output.with_suffix(".json")
    if geometry == output:
        raise UsageError(f"-o {output}: the launch geometry is written beside the source as {geometry}; "
                         "give the source another name (kernel.cu)")
    output_file(geometry, "-o", what="launch geometry")
    program = load_program(file)
    m = program.pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    from habu.gpu_info import current_arch

    tgt = target_named(target or current_arch())
    compiled = compile_model(program, m.name, sizes, tgt, parse_pins(pin or []), trials=1)
    source, description = standalone(compiled, tgt)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(source)
    geometry.write_text(geometry_json(description))
    count = sum(len(member["kernels"]) for member in description["members"])
    print(f"wrote {output} ({count} kernel(s) for {tgt.name}, compiles alone: nvcc -cubin -arch={tgt.name} "
          f"{output.name}) and {geometry}")


def export(
    file: FileArg,
    out: Annotated[Path, typer.Option("-o", "--out", help="Directory for the bundle.")],
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
    target: Annotated[list[str] | None, typer.Option(
        "--target", help=f"GPU target, repeatable: {', '.join(TARGETS)} (default {DEFAULT_TARGET}).")] = None,
    pin: PinOpt = None,
    trials: Annotated[int, typer.Option("--trials", help="Finite-field trials.")] = 3,
) -> None:
    """Ahead-of-time bundle: the cubins per target, a C header and a C launcher over the CUDA driver API."""
    from habu.cli_paths import output_dir
    from habu.compile import compile_model
    from habu.export import bundle_stem, export_bundle
    from habu.search.space import parse_pins
    from habu.spec.parser import load_program
    from habu.target import target_named

    output_dir(out, "-o")
    program = load_program(file)
    m = program.pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    targets = [target_named(t) for t in dict.fromkeys(target or [DEFAULT_TARGET])]
    pins = parse_pins(pin or [])
    builds = [(compile_model(program, m.name, sizes, tgt, pins, trials), tgt) for tgt in targets]
    files = export_bundle(builds, out)
    stem = bundle_stem(m.name)
    print("wrote " + ", ".join(str(f) for f in files))
    print(f"build: gcc -c {out / stem}.c -I<cuda>/include; link with -lcuda; call habu_{stem}(...) "
          f"declared in {out / stem}.h")
