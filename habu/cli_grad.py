"""`habu grad`: the derived backward model of a model, as Habu text (habu/spec/grad.py does the work)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from habu.cli_options import FileArg
from habu.errors import UsageError

WrtOpt = Annotated[list[str] | None, typer.Option(
    "--wrt", help="An input to differentiate by (repeat, or comma-separate; default: every input but index tensors).")]
SaveOpt = Annotated[str, typer.Option(
    "--save", help="Which forward values the backward reads from memory: auto (those that take a reduction: "
                   "RMSNorm's rstd, contraction outputs; and contraction operands, which the forward stores "
                   "anyway: a GELU output a LINEAR reads; recompute other elementwise ones), save (all), "
                   "recompute (none).")]
KeepOpt = Annotated[list[str] | None, typer.Option(
    "--save-value", help="A forward value to save whatever --save says, named as the header of habu grad's "
                         "output lists it (%3, %s1); repeat for several.")]
RecomputeOpt = Annotated[list[str] | None, typer.Option(
    "--recompute-value", help="A forward value to recompute whatever --save says (%3, %s1); repeat for several.")]
ModelOpt = Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")]


def save_policy(mode: str, save_values: list[str] | None = None, recompute_values: list[str] | None = None):
    """The `SavePolicy` of the --save option."""
    from habu.spec.grad_save import SaveMode, SavePolicy

    try:
        m = SaveMode(mode)
    except ValueError:
        raise UsageError(f"--save takes {', '.join(s.value for s in SaveMode)}, got {mode!r}") from None
    return SavePolicy(m, frozenset(save_values or ()), frozenset(recompute_values or ()))


def wrt_names(wrt: list[str] | None) -> list[str] | None:
    if not wrt:
        return None
    return [n.strip() for item in wrt for n in item.split(",") if n.strip()]


def grad(
    file: FileArg,
    model: ModelOpt = None,
    output: Annotated[Path | None, typer.Option("-o", "--output", help="Write the backward model here "
                                                                       "(a .habu file) instead of printing it.")] = None,
    wrt: WrtOpt = None,
    save: SaveOpt = "auto",
    save_value: KeepOpt = None,
    recompute_value: RecomputeOpt = None,
    check: Annotated[bool, typer.Option("--check", help="Also check the derivation: the dual-number identity "
                                                        "<u, J v> = <J^T u, v> over GF(p), and in float64 by "
                                                        "central differences, at small sizes.")] = False,
) -> None:
    """Derive the backward model: each input's gradient as equations over the forward inputs, the saved
    forward values and the output gradients; print it as Habu text (habu check reads it)."""
    from habu.cli_paths import output_file
    from habu.spec.grad_program import derive_model
    from habu.spec.grad_text import backward_text
    from habu.spec.parser import load_program

    if output is not None:
        output_file(output, "-o", suffix=".habu")
    program = load_program(file)
    m = program.pick(model)
    bw = derive_model(program, m.name, wrt_names(wrt), save_policy(save, save_value, recompute_value))
    unknown = sorted((set(save_value or ()) | set(recompute_value or ())) - set(bw.choices))
    if unknown:
        raise UsageError(f"--save-value/--recompute-value {', '.join(unknown)}: the backward of {m.name} reads no "
                         f"such forward value (it reads {', '.join(bw.choices) or 'none'})")
    text = backward_text(bw, str(file))
    if check:
        from habu.errors import HabuError
        from habu.spec.grad_check import adjoint_check, finite_difference_check

        for name, result in (("finite field", adjoint_check(bw, m)), ("float64", finite_difference_check(bw, m))):
            if not result.passed:
                raise HabuError(f"the backward of {m.name} fails the {name} check: {result.detail}",
                                program.model_spans.get(m.name))
            print(f"{name}: {result.detail}", file=sys.stderr)
    if output is None:
        print(text, end="")
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}: {len(bw.model.nodes)} equations; gradients "
          + ", ".join(f"{g} of {x}" for x, g in bw.gradients))


def backward_program(program, model_name: str, wrt: list[str] | None, save: str,
                     save_value: list[str] | None = None, recompute_value: list[str] | None = None):
    """`program` with the backward of `model_name` added as a model; its name."""
    from habu.spec.grad_program import derive_model

    bw = derive_model(program, model_name, wrt_names(wrt), save_policy(save, save_value, recompute_value))
    program.models[bw.model.name] = bw.model
    program.model_spans[bw.model.name] = program.model_spans[program.model(model_name).name]
    return program, bw.model.name
