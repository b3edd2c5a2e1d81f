"""The `habu` command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from habu import __version__
from habu.errors import HabuError, UsageError

app = typer.Typer(
    name="habu",
    help="Habu: write the equation, get a proven, benchmarked GPU kernel.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"habu {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Habu: write the equation, get a proven, benchmarked GPU kernel."""


FileArg = Annotated[Path, typer.Argument(help="A .habu file.", show_default=False)]
ShapeOpt = Annotated[str | None, typer.Option("--shape", help="Extent sizes, e.g. K=511,M=256.")]


def parse_shape(text: str | None, known: list[str] | None = None) -> dict[str, int]:
    """`K=511,M=256` (or `#K=511`) into {'K': 511, 'M': 256}."""
    sizes: dict[str, int] = {}
    if not text:
        return sizes
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        name, sep, value = part.partition("=")
        name = name.strip().lstrip("#")
        if not sep or not name or not value.strip().lstrip("-").isdigit():
            raise UsageError(f"--shape takes NAME=SIZE pairs separated by commas, got {part!r}")
        n = int(value)
        if n < 1 or n > 2**40:
            raise UsageError(f"--shape {name}={n}: a size must be between 1 and 2^40")
        if known is not None:
            match = [k for k in known if k == name] or [k for k in known if k.lower() == name.lower()]
            if not match:
                raise UsageError(f"--shape names extent #{name}, which the model does not have "
                                 f"(it has {', '.join('#' + k for k in known)})")
            name = match[0]
        sizes[name] = n
    return sizes


@app.command()
def check(file: FileArg) -> None:
    """Parse and type-check a file; print each model's extents, dataflow and obligations."""
    from habu.spec.parser import load_program
    from habu.spec.report import describe_program

    program = load_program(file)
    print(describe_program(program), end="")


@app.command()
def words(file: Annotated[Path | None, typer.Argument(help="Also list this file's words.")] = None) -> None:
    """List the word library: each word's stack effect and meaning."""
    from habu.spec.parser import load_program, prelude

    program = load_program(file) if file else prelude()
    width = max(len(w) for w in program.words)
    for name, w in program.words.items():
        print(f"{name:<{width}}  {w.effect_text():<36} {w.meaning()}")


@app.command("eval")
def eval_(
    file: FileArg,
    inputs: Annotated[Path, typer.Option("--inputs", help="An .npz with one array per input tensor.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the outputs (.npz).")],
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
) -> None:
    """Evaluate a model in float64 on the arrays of an .npz file."""
    import numpy as np

    from habu.spec.parser import load_program
    from habu.spec.reference import evaluate

    program = load_program(file)
    m = pick_model(program, model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    try:
        with np.load(inputs, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise UsageError(f"no such file: {inputs}") from None
    except (ValueError, OSError) as exc:
        raise UsageError(f"{inputs} is not a readable .npz file ({exc})") from None
    extra = sorted(set(arrays) - {t.name for t in m.inputs})
    if extra:
        print(f"habu: warning: {inputs} has arrays the model does not read: {', '.join(extra)}", file=sys.stderr)
    result = evaluate(m, arrays, sizes)
    np.savez(output, **result)
    for name, arr in result.items():
        print(f"{name}: shape {tuple(arr.shape)} float64 -> {output}")


TargetOpt = Annotated[str, typer.Option("--target", help="GPU architecture: sm_90a, sm_80, sm_100a.")]
PinOpt = Annotated[list[str] | None, typer.Option("--pin", help="Fix a plan choice: tile=128x128x64, mma=wgmma, "
                                                                 "stages=4, B=tma, A=cp.async, split_k=2, ...")]


@app.command()
def compile(
    file: FileArg,
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
    target: TargetOpt = "sm_90a",
    pin: PinOpt = None,
    out: Annotated[Path, typer.Option("-o", "--out", help="Directory for the plan and the report.")] = Path("out"),
    trials: Annotated[int, typer.Option("--trials", help="Finite-field trials.")] = 3,
) -> None:
    """Pick the default plan (or the pinned choices), prove it, write the plan and its report."""
    from habu.compile import compile_model, write_outputs
    from habu.search.space import parse_pins
    from habu.spec.parser import load_program
    from habu.target import target_named

    program = load_program(file)
    m = pick_model(program, model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    tgt = target_named(target)
    compiled = compile_model(program, m.name, sizes, tgt, parse_pins(pin or []), trials)
    files = write_outputs(out, compiled.model, compiled, tgt)
    for plan, proof in zip(compiled.plans, compiled.proofs, strict=True):
        guard = f" where {' and '.join(plan.guards)}" if plan.guards else ""
        print(f"plan {plan.key}{guard}: {len(proof.obligations)} obligations proved or checked at run time; "
              f"finite field: {proof.certificate.summary() if proof.certificate else 'not run'}")
    print("wrote " + ", ".join(str(f) for f in files))


@app.command()
def emit(
    file: FileArg,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the CUDA source.")],
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
    target: TargetOpt = "sm_90a",
    pin: PinOpt = None,
) -> None:
    """Write the CUDA source of the default (or pinned) plan, after proving it."""
    from habu.compile import compile_model, cuda_source
    from habu.search.space import parse_pins
    from habu.spec.parser import load_program
    from habu.target import target_named

    program = load_program(file)
    m = pick_model(program, model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    tgt = target_named(target)
    compiled = compile_model(program, m.name, sizes, tgt, parse_pins(pin or []), trials=1)
    sources = [cuda_source(compiled.model, plan, tgt)[0] for plan in compiled.plans]
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("\n".join(sources))
    print(f"wrote {output}: {sum(s.count('__global__') for s in sources)} kernel(s) for {tgt.name}")


@app.command()
def verify(
    file: FileArg,
    plan: Annotated[Path, typer.Option("--plan", help="A plan written by habu compile (or edited by hand).")],
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
    trials: Annotated[int, typer.Option("--trials", help="Finite-field trials.")] = 3,
) -> None:
    """Re-check a stored or hand-edited plan: the hardware rules and the finite-field check."""
    from habu.compile import plan_error, verify_file
    from habu.spec.parser import load_program

    program = load_program(file)
    m = pick_model(program, model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    bound, proof = verify_file(program, m.name, plan, sizes, trials)
    if proof.violations:
        raise plan_error(program, bound, proof.violations[0])
    c = proof.certificate
    assert c is not None
    if not c.passed:
        raise HabuError(f"{plan} does not compute {m.name}: {c.failure}", program.model_spans.get(m.name))
    print(f"{plan}: {len(proof.obligations)} obligations hold; finite field: {c.summary()}")


def pick_model(program, name: str | None):
    if name is not None:
        return program.model(name)
    if len(program.models) == 1:
        return next(iter(program.models.values()))
    if not program.models:
        raise UsageError(f"{program.path} defines no MODEL")
    raise UsageError(f"{program.path} defines several models ({', '.join(program.models)}): pick one with --model")


def main() -> None:
    try:
        app(standalone_mode=False)
    except HabuError as err:
        print(err.render(), file=sys.stderr)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("habu: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:  # click's own usage errors
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code if exc.exit_code else 2)
        if isinstance(exc, click.exceptions.Abort):
            print("habu: aborted", file=sys.stderr)
            sys.exit(1)
        raise


if __name__ == "__main__":
    main()
