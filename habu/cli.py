"""The `habu` command line."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from habu.cli_grad import KeepOpt, RecomputeOpt, SaveOpt, WrtOpt, backward_program, grad
from habu.cli_kernels import emit, export
from habu.cli_options import FileArg, MachineTargetOpt, PinOpt, ShapeOpt, extents_of, parse_shape
from habu.cli_plans import DbOpt, output_console, plans_app
from habu.errors import HabuError, UsageError
from habu.targets import TARGETS
from habu.version import __version__

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


@app.command()
def check(file: FileArg) -> None:
    """Parse and type-check a file; print each model's extents, dataflow and obligations."""
    from habu.spec.parser import load_program
    from habu.spec.report import describe_program

    program = load_program(file)
    from habu.prove.limits import check_sizes

    for m in program.models.values():  # sizes no target holds are refused here already
        check_sizes(m, m.sizes, max(TARGETS.values(), key=lambda t: t.device_memory), ", the largest of any target")
    print(describe_program(program), end="")


@app.command()
def words(file: Annotated[Path | None, typer.Argument(help="Also list this file's words.")] = None) -> None:
    """List the word library: each word's stack effect and meaning, then the element types."""
    from habu.spec.parser import load_program, prelude

    program = load_program(file) if file else prelude()
    width = max(len(w) for w in program.words)
    for name, w in program.words.items():
        print(f"{name:<{width}}  {w.effect_text():<36} {w.meaning()}")
    from habu.spec.dtypes import dtype_summary

    print(dtype_summary())


@app.command("eval")
def eval_(
    file: FileArg,
    inputs: Annotated[Path, typer.Option("--inputs", help="An .npz with one array per input tensor.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the outputs (.npz).")],
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
) -> None:
    """Evaluate a model in float64 on the arrays of an .npz file (--shape fixes extents' sizes, as for compile)."""
    import numpy as np

    from habu.cli_paths import output_file
    from habu.compile import bind_shape
    from habu.spec.parser import load_program
    from habu.spec.reference import evaluate

    output_file(output, "--output", suffix=".npz")
    program = load_program(file)
    m = program.pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    m = bind_shape(m, sizes)
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


@app.command()
def compile(
    file: FileArg,
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
    target: MachineTargetOpt = None,
    pin: PinOpt = None,
    out: Annotated[Path, typer.Option("-o", "--out", help="Directory for the plan and the report.")] = Path("out"),
    trials: Annotated[int, typer.Option("--trials", help="Finite-field trials.")] = 3,
    backward: Annotated[bool, typer.Option("--backward", help="Compile the model's derived backward model "
                                                              "(habu grad prints it).")] = False,
    wrt: WrtOpt = None,
    save: SaveOpt = "auto",
    save_value: KeepOpt = None,
    recompute_value: RecomputeOpt = None,
) -> None:
    """Pick the default plan (or the pinned choices), prove it, write the plan and its report."""
    from habu.cli_paths import output_dir
    from habu.compile import compile_model, write_outputs
    from habu.search.space import parse_pins
    from habu.spec.parser import load_program
    from habu.target import target_named

    output_dir(out, "-o")
    program = load_program(file)
    m = program.pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    if backward:
        program, name = backward_program(program, m.name, wrt, save, save_value, recompute_value)
        m = program.model(name)
        sizes = extents_of(m, sizes)
    from habu.gpu_info import current_arch

    tgt = target_named(target or current_arch())
    compiled = compile_model(program, m.name, sizes, tgt, parse_pins(pin or []), trials)
    files = write_outputs(out, compiled.model, compiled, tgt)
    for plan, proof in zip(compiled.plans, compiled.proofs, strict=True):
        guard = f" where {' and '.join(plan.guards)}" if plan.guards else ""
        print(f"plan {plan.key}{guard}: {len(proof.obligations)} obligations proved or checked at run time; "
              f"finite field: {proof.certificate.summary() if proof.certificate else 'not run'}")
    print("wrote " + ", ".join(str(f) for f in files))


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
    m = program.pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    bound, proof = verify_file(program, m.name, plan, sizes, trials)
    if proof.violations:
        raise plan_error(program, bound, proof.violations[0],
                         "edit the plan's fields, or give a shape that satisfies the rule")
    from habu.api import guard_holds
    from habu.prove.trust import guard_mismatch

    wrong_guards = guard_mismatch(proof.plan, proof, guard_holds(dict(proof.plan.shape) | sizes))
    if wrong_guards:
        raise HabuError(f"{plan}: {wrong_guards}", program.model_spans.get(m.name),
                        ("a member of a checked kernel set runs only where its guards hold: they must be "
                         "exactly the conditions its rules need",))
    c = proof.certificate
    assert c is not None
    if not c.passed:
        raise HabuError(f"{plan} does not compute {m.name}: {c.failure}", program.model_spans.get(m.name))
    print(f"{plan}: {len(proof.obligations)} obligations hold; finite field: {c.summary()}")


@app.command()
def search(
    file: FileArg,
    budget: Annotated[str, typer.Option("--budget", help="Wall clock (90s, 10m, 1h) or a number of candidates.")] = "90s",
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
    target: Annotated[str | None, typer.Option("--target", help="GPU architecture (default: this GPU's).")] = None,
    db: DbOpt = None,
    top_k: Annotated[int, typer.Option("--top-k", help="Plans kept per entry.")] = 5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the finite-field trials and inputs.")] = 0,
    no_gpu: Annotated[bool, typer.Option("--no-gpu", help="Do not time: rank by the cost model.")] = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Local processes proving and compiling "
                                                                  "(default: one per CPU but one; 1: in this process).")] = None,
    ray: Annotated[str | None, typer.Option("--ray", help="Run on a Ray cluster: local (a new one for this run), "
                                                          "HOST:PORT, or auto (the address in RAY_ADDRESS or "
                                                          "/tmp/ray/ray_current_cluster).")] = None,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Directory for the report and roofline plot.")] = None,
    backward: Annotated[bool, typer.Option("--backward", help="Search the model's derived backward model, stored "
                                                              "as NAME-GRAD, NAME-GRAD-SAVE or NAME-GRAD-RECOMPUTE "
                                                              "by save policy (habu.load(path, 'NAME-GRAD') finds "
                                                              "it).")] = False,
    save: Annotated[str, typer.Option("--save", help="With --backward: the save policy (auto, save, recompute; "
                                                     "see habu grad), or all: search each (the budget shared) "
                                                     "and report the fastest proven one.")] = "all",
) -> None:
    """Search the plan space within a budget; keep the best verified plans in the plan database."""
    from habu.spec.parser import load_program
    from habu.tuning import tune

    results = output_console()  # the results; progress and notes go to stderr
    m = load_program(file).pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])  # the forward model's extents
    if backward and save == "all":
        _search_save_policies(file, m, sizes, target, budget, db, top_k, seed, no_gpu, jobs, ray, out, results)
        return
    if backward:
        from habu.cli_grad import save_policy
        from habu.spec.grad_program import backward_name

        name = backward_name(m.name, save_policy(save).mode.value)
        m = with_backward_model(file, name)
        sizes = extents_of(m, sizes)
    tuned = tune(file, m.name, shape=sizes, target=target, budget=budget,
                 db=db, top_k=top_k, seed=seed, no_gpu=no_gpu, jobs=jobs, ray=ray, out=out,
                 log=output_console(stderr=True), on_tuned=lambda t: _print_tuned(results, t))
    if tuned.interrupted:
        stored = " (the plans verified so far are stored)" if any(t.best is not None for t in tuned.tuned) else ""
        output_console(stderr=True).print(f"habu: interrupted{stored}", highlight=False)
        raise typer.Exit(130)


def _search_save_policies(file: Path, m, sizes, target, budget, db, top_k, seed, no_gpu, jobs, ray, out,
                          results) -> None:
    """`habu search --backward` over every save policy: one search each, the fastest proven one named."""
    from habu.errors import HabuError
    from habu.spec.grad_program import backward_name
    from habu.tuning import tune_backward

    bw = with_backward_model(file, backward_name(m.name))
    choice = tune_backward(file, m.name, shape=extents_of(bw, sizes), target=target,
                           budget=budget, db=db, top_k=top_k, seed=seed, no_gpu=no_gpu, jobs=jobs, ray=ray,
                           out=out, log=output_console(stderr=True), on_tuned=lambda t: _print_tuned(results, t))
    if choice.interrupted:
        output_console(stderr=True).print("habu: interrupted (the plans verified so far are stored)",
                                          highlight=False)
        raise typer.Exit(130)
    if choice.best is None:
        raise HabuError(f"the search verified no backward plan for {m.name} under any save policy; nothing was "
                        "stored (give it a larger --budget)")
    results.print(choice.describe(), highlight=False, soft_wrap=True)


def with_backward_model(file: Path, name: str):
    """The derived backward model `name` (habu.spec.grad_program.backward_name) of `file`."""
    from habu.spec.grad_program import with_backward
    from habu.spec.parser import load_program

    return with_backward(load_program(file), name).model(name)


def _print_tuned(console, tuned) -> None:
    """A target's search on stdout: the table of the best plans, the baseline, the winner and what was written."""
    from habu.search.report import time_account, top_table

    result = tuned.result
    if result.best is None:
        return
    st = result.stats
    console.print(top_table(result.records, st.roofline_us, st.baseline_us))
    if st.baseline_us:
        console.print(f"baseline: {st.baseline}, {st.baseline_us:.1f} µs in this run", highlight=False)
    elif st.baseline_failure:
        console.print(f"[yellow]baseline not timed: {st.baseline_failure}[/]", highlight=False)
    elif result.measured:
        console.print("baseline: none for this model", highlight=False)
    measured = "measured" if result.measured else "UNMEASURED (no GPU: ranked by the cost model)"
    first = f"{st.first_verified_s:.1f} s" if st.first_verified_s is not None else "never"
    console.print(f"winner: plan {result.best.key}, {measured}; stored in {tuned.db_path} as entry "
                  f"{result.key.digest()}; first verified candidate after {first}; {st.verified} verified "
                  f"in {st.elapsed:.0f} s ({st.verified / max(st.elapsed, 1e-9):.2f} per second, {tuned.executor})",
                  highlight=False)
    if not result.measured:
        console.print(PREDICTION_NOTE, highlight=False)
    if st.refused_slow:
        console.print(f"{st.refused_slow} proven candidate(s) predicted faster were not kept: ptxas spilled or "
                      f"serialized their wgmma (the last: {st.last_slow})", highlight=False)
    if st.spent:
        console.print(f"time: {time_account(st)}", highlight=False)
    if tuned.files:
        console.print("wrote " + ", ".join(str(f) for f in tuned.files), highlight=False)


app.command()(emit)
app.command()(grad)
app.command()(export)
app.add_typer(plans_app, name="plans")


@app.command()
def run(
    file: FileArg,
    inputs: Annotated[Path, typer.Option("--inputs", help="An .npz with one array per input tensor.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the outputs (.npz).")],
    model: Annotated[str | None, typer.Option("--model", help="The model (default: the only one).")] = None,
    shape: ShapeOpt = None,
    db: DbOpt = None,
) -> None:
    """Run a model on the GPU with its tuned plan from the database (the default plan on a miss)."""
    import numpy as np

    from habu.api import load
    from habu.cli_paths import output_file
    from habu.emit_cuda.driver import DeviceArray, device
    from habu.gpu_info import device_info
    from habu.spec.parser import load_program

    output_file(output, "--output", suffix=".npz")
    if device_info() is None:
        raise UsageError("habu run needs a CUDA GPU (habu eval evaluates on the CPU in float64)")
    program = load_program(file)
    m = program.pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    compiled = load(file, m.name, db=db, **sizes)
    with np.load(inputs, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    dev = device(0)
    gpu = {}
    for t in compiled.model.inputs:
        if t.name not in arrays:
            raise UsageError(f"{inputs} has no array {t.name}")
        dtype = t.dtype.name if t.dtype else "f32"
        arr = DeviceArray(arrays[t.name].shape, dtype, dev)
        arr.copy_from_host(arrays[t.name])
        gpu[t.name] = arr
    result = compiled(**gpu)
    result = result if isinstance(result, dict) else {compiled.model.outputs[0].name: result}
    from habu.emit_cuda.driver import bf16_bits_to_float

    host = {k: bf16_bits_to_float(v.to_host()) if v.dtype == "bf16" else v.to_host() for k, v in result.items()}
    np.savez(output, **host)  # bf16 outputs as float32 (exact), never as raw bits
    print(f"wrote {', '.join(result)} to {output}")


# what a search without a GPU can claim (the figures: docs/PERF.md, "The cost model against 1715 timed
# GGEMM plans"); ties in predicted time are ordered by the operand bytes fetched from DRAM
PREDICTION_NOTE = ("note: nothing was timed: the ranking and the winner are the cost model's prediction (its "
                   "Spearman rank correlation with times measured on the H200: 0.82 over 1715 GGEMM plans, 0.61 "
                   "over 1135 MoE plans; plans it predicts equal are ordered by finer terms: pipeline depth, "
                   "cold pipeline fills, L2 and DRAM operand traffic). Run habu search on a machine with a GPU, or with --ray and a GPU pool, to "
                   "measure them.")


def main() -> None:
    try:
        status = app(standalone_mode=False)  # click answers typer.Exit(n) by returning n here
    except HabuError as err:
        print(err.render(), file=sys.stderr)
        sys.exit(1)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("habu: interrupted", file=sys.stderr)
        sys.exit(130)
    except MemoryError:  # a proof or a reference evaluation larger than this machine's memory
        print("error: out of memory: the proof (its finite-field check or the float64 reference) needed more "
              "memory than this process may use; try smaller sizes with --shape, or fewer --trials", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # click's own usage errors (typer >= 0.29 vendors its own click)
        usage_errors, aborts = _click_error_types()
        if isinstance(exc, usage_errors):
            exc.show()
            sys.exit(exc.exit_code if exc.exit_code else 2)
        if isinstance(exc, aborts):
            if isinstance(exc.__context__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
                print("habu: interrupted", file=sys.stderr)
                sys.exit(130)
            print("habu: aborted", file=sys.stderr)
            sys.exit(1)
        if os.environ.get("HABU_TRACEBACK"):
            raise
        sys.exit(internal_error(exc))
    if isinstance(status, int) and status:
        sys.exit(status)


INTERNAL_ERROR = 70  # EX_SOFTWARE (sysexits.h): the command failed through a fault of Habu's, not the input's


def internal_error(exc: BaseException) -> int:
    """One line for an exception no user mistake explains (a Habu bug): what it was, where it was raised and how
    to see the whole traceback; the exit status to leave with."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    text = " ".join(str(exc).split())
    print(f"habu: internal error (a bug in Habu, not in the input; please report it with the command): "
          f"{type(exc).__name__}{where}: {text[:400]} (HABU_TRACEBACK=1 prints the traceback)", file=sys.stderr)
    return INTERNAL_ERROR


def _click_error_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """Click's usage-error and abort classes, from click itself and from the copy typer vendors."""
    import importlib

    usage: list[type] = []
    aborts: list[type] = []
    for name in ("click.exceptions", "typer._click.exceptions"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        usage.append(mod.ClickException)
        if hasattr(mod, "Abort"):
            aborts.append(mod.Abort)
    return tuple(usage), tuple(aborts)

if __name__ == "__main__":
    main()
