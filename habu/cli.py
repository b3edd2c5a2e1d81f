"""The `habu` command line."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from habu.errors import HabuError, UsageError
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
    """Evaluate a model in float64 on the arrays of an .npz file."""
    import numpy as np

    from habu.spec.parser import load_program
    from habu.spec.reference import evaluate

    program = load_program(file)
    m = program.pick(model)
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
                                                                 "stages=4, B=tma, A=cp.async, split_k=2, rewrite=factor:Y, ...")]


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
    m = program.pick(model)
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
    m = program.pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    tgt = target_named(target)
    compiled = compile_model(program, m.name, sizes, tgt, parse_pins(pin or []), trials=1)
    sources = [cuda_source(proof, tgt)[0] for proof in compiled.proofs]
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
    m = program.pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    bound, proof = verify_file(program, m.name, plan, sizes, trials)
    if proof.violations:
        raise plan_error(program, bound, proof.violations[0])
    c = proof.certificate
    assert c is not None
    if not c.passed:
        raise HabuError(f"{plan} does not compute {m.name}: {c.failure}", program.model_spans.get(m.name))
    print(f"{plan}: {len(proof.obligations)} obligations hold; finite field: {c.summary()}")


DbOpt = Annotated[Path | None, typer.Option("--db", help="The plan database (default: $HABU_DB or the cache dir).")]


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
    ray: Annotated[str | None, typer.Option("--ray", help="Run on a Ray cluster: auto (the one this machine "
                                                          "joined), an address, or local.")] = None,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Directory for the report and roofline plot.")] = None,
) -> None:
    """Search the plan space within a budget; keep the best verified plans in the plan database."""

    from habu.api import current_target
    from habu.compile import bind_shape
    from habu.db import PlanDB
    from habu.search.loop import Budget, Search
    from habu.search.pool import local_executor
    from habu.search.report import Progress
    from habu.search.tasks import Job
    from habu.spec.parser import load_program
    from habu.target import target_named

    console = output_console(stderr=True)
    program = load_program(file)
    m = program.pick(model)
    sizes = parse_shape(shape, [e.name for e in m.extents])
    missing = [e.name for e in m.extents if not e.is_static and e.name not in sizes]
    if missing:
        raise UsageError(f"search tunes one shape: give the runtime extents with --shape ({', '.join(missing)})")
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs takes a positive number, got {jobs}")
    bound = bind_shape(m, sizes)
    plan_budget = Budget.parse(budget)
    job = Job.of(str(file), bound, {e.name: e.size for e in bound.extents}, target or current_target())
    if ray is not None:
        executor, runs, cleanup = _ray_runs(console, ray, job, target, no_gpu)
    else:
        executor, cleanup = local_executor(jobs), None
        runs = [(target_named(target or current_target()), None if no_gpu else _local_timer(console, file, m, sizes))]
    try:
        share = Budget(plan_budget.seconds / len(runs), None) if plan_budget.seconds and len(runs) > 1 else plan_budget
        for tgt, timer in runs:
            with PlanDB(db) as plans, Progress(share, console) as progress:
                s = Search(str(file), bound, tgt, sizes, plans, share, timer, top_k, seed, progress, executor)
                result = s.run()
                progress(result.stats)
                _report_search(console, result, plans.path, bound, sizes, tgt,
                               out or Path("out") / "search" / m.name.lower(), executor.name, len(runs) > 1)
    finally:
        executor.close()
        if cleanup is not None:
            cleanup()


def _local_timer(console, file: Path, m, sizes):
    """The timing worker on this machine's GPU, or None (said plainly) when there is none."""
    from habu.timing.worker import GpuTimer

    timer = GpuTimer(str(file), m.name, sizes)
    console.print(f"starting the timing worker on the GPU for {m.name} ...", highlight=False)
    if timer.start() is None:
        console.print(f"[yellow]nothing will be timed: {timer.unavailable or 'no GPU found'}; "
                      "candidates are ranked by the cost model and the winner is stored as unmeasured[/]")
        return None
    console.print(f"timing on {timer.info['gpu']} ({timer.info['sm_count']} SMs)", highlight=False)
    return timer


def _ray_runs(console, address: str, job, target: str | None, no_gpu: bool):
    """The Ray executor and one (target, GPU pool) run per kind of GPU in the cluster."""
    from habu.cluster.ray_pool import RayExecutor, connect, gpu_pools, ray_module
    from habu.target import TARGETS, target_named

    connect(address)
    ray = ray_module()
    executor = RayExecutor()
    resources = ray.cluster_resources()
    console.print(f"Ray cluster: {len(ray.nodes())} node(s), {int(resources.get('CPU', 0))} CPUs, "
                  f"{int(resources.get('GPU', 0))} GPUs", highlight=False)
    pools, problems = ([], []) if no_gpu else gpu_pools(job)
    for p in problems:
        console.print(f"[yellow]a GPU actor could not start: {p}[/]", highlight=False)
    runs = []
    for pool in pools:
        arch = pool.info.get("arch")
        if (target is not None and arch != target) or arch not in TARGETS:
            console.print(f"[yellow]skipping {len(pool.actors)} {pool.info.get('gpu')} GPU(s): they run {arch}, "
                          f"the search is for {target or 'a known target'}[/]", highlight=False)
            pool.close()
            continue
        console.print(f"timing on {len(pool.actors)} × {pool.info['gpu']} ({pool.info['sm_count']} SMs)",
                      highlight=False)
        runs.append((target_named(arch), pool))
    if not runs:
        if not no_gpu:
            console.print("[yellow]nothing will be timed: the cluster has no usable GPU; candidates are ranked by "
                          "the cost model and the winner is stored as unmeasured[/]")
        runs = [(target_named(job.target), None)]
    return executor, runs, ray.shutdown


def _report_search(console, result, db_path, bound, sizes, tgt, out_dir: Path, executor: str,
                   per_gpu: bool = False) -> None:
    """The table of the best plans, the winner's report, CUDA and roofline plot."""
    from habu.compile import Compiled, write_outputs
    from habu.prove import prove
    from habu.search.cost import CEILINGS, Ceilings, compute_peak
    from habu.search.report import roofline_plot, time_account, top_table, write_candidates

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
    console.print(f"winner: plan {result.best.key}, {measured}; stored in {db_path} as entry "
                  f"{result.key.digest()}; first verified candidate after {first}; {st.verified} verified "
                  f"in {st.elapsed:.0f} s ({st.verified / max(st.elapsed, 1e-9):.2f} per second, {executor})",
                  highlight=False)
    if st.spent:
        console.print(f"time: {time_account(st)}", highlight=False)
    if per_gpu:  # several kinds of GPU tuned at once: a directory for each
        out_dir = out_dir / re.sub(r"[^A-Za-z0-9_.-]+", "-", result.key.target.gpu)
    proof = prove(bound, result.best, sizes, trials=3)
    compiled = Compiled(bound, [result.best], [proof])
    files = write_outputs(out_dir, bound, compiled, tgt)
    best = result.records[0] if result.records else None
    extra = ""
    if best is not None and best.median_us and st.roofline_us:
        extra = (f"\n\n## Measured\n\nmedian {best.median_us:.1f} µs (p20 {best.p20_us:.1f}, p80 {best.p80_us:.1f}); "
                 f"roofline {st.roofline_us:.1f} µs: {100 * st.roofline_us / best.median_us:.0f}% of it\n")
        if st.baseline_us:
            extra += (f"\nbaseline {st.baseline}: {st.baseline_us:.1f} µs in the same run; the plan is "
                      f"{st.baseline_us / best.median_us:.2f}× its speed\n")
    (out_dir / "report.md").write_text((out_dir / "report.md").read_text() + extra)
    c = CEILINGS.get(tgt.name, Ceilings())
    png = roofline_plot(result, out_dir / "roofline.png", compute_peak(c), c.bandwidth)
    timed = [write_candidates(result, out_dir / "candidates.csv")] if result.measured else []
    console.print("wrote " + ", ".join(str(f) for f in [*files, *([png] if png else []), *timed]), highlight=False)


plans_app = typer.Typer(help="The plan database: list, show, remove, export and import tuned plans.",
                        no_args_is_help=True)
app.add_typer(plans_app, name="plans")


@plans_app.command("ls")
def plans_ls(db: DbOpt = None) -> None:
    """Every entry: model, shape, GPU, best time, and whether it matches this Habu and compiler."""
    from rich.table import Table

    from habu.db import PlanDB
    from habu.search.report import plan_summary

    with PlanDB(db) as plans:
        entries = plans.entries()
        table = Table(title=str(plans.path))
    for col in ("id", "model", "shape", "target", "best", "plan", "updated"):
        table.add_column(col, no_wrap=col in ("id", "shape"))
    import time as _t

    for e in entries:
        best = e.records[0] if e.records else None
        when = _t.strftime("%Y-%m-%d %H:%M", _t.localtime(e.updated))
        status = (f"{best.median_us:.1f} µs" if best and best.median_us else
                  ("unmeasured" if best else "failures only"))
        table.add_row(e.digest[:12], e.key.model, " ".join(f"{k}={v}" for k, v in e.key.shape),
                      f"{e.key.target.arch} {e.key.target.gpu}", status, plan_summary(best.plan) if best else "",
                      when)
    output_console().print(table)


@plans_app.command("show")
def plans_show(entry: Annotated[str, typer.Argument(help="An entry id (or its start).")], db: DbOpt = None) -> None:
    """One entry: its key, its plans with timings and certificates, its failures."""
    import json as _json
    from dataclasses import asdict

    from habu.db import PlanDB

    with PlanDB(db) as plans:
        e = plans.find(entry)
    print(_json.dumps({"id": e.digest, "key": asdict(e.key), "records": [asdict(r) for r in e.records],
                       "failures": e.failures}, indent=1))


@plans_app.command("rm")
def plans_rm(entry: Annotated[str, typer.Argument(help="An entry id (or its start).")], db: DbOpt = None) -> None:
    """Remove an entry."""
    from habu.db import PlanDB

    with PlanDB(db) as plans:
        plans.find(entry)
        n = plans.remove(entry)
    print(f"removed {n} entr{'y' if n == 1 else 'ies'}")


@plans_app.command("export")
def plans_export(file: Annotated[Path, typer.Argument(help="The file to write (JSON).")],
                 entries: Annotated[list[str] | None, typer.Argument(help="Entry ids (default: all).")] = None,
                 db: DbOpt = None) -> None:
    """Write entries to a portable file a team can share."""
    from habu.db import PlanDB

    with PlanDB(db) as plans:
        n = plans.export(file, entries)
    print(f"exported {n} entries to {file}")


@plans_app.command("import")
def plans_import(file: Annotated[Path, typer.Argument(help="A file written by habu plans export.")],
                 db: DbOpt = None) -> None:
    """Merge an exported file into the database (keeping the best plans of both)."""
    from habu.db import PlanDB

    with PlanDB(db) as plans:
        n = plans.import_(file)
    print(f"imported {n} entries into {plans.path}")


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
    from habu.emit_cuda.driver import DeviceArray, device
    from habu.gpu_info import device_info
    from habu.spec.parser import load_program

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


def output_console(stderr: bool = False):
    """A rich console; piped or redirected output gets wide lines instead of an 80-column wrap,
    so ids and plans stay on one line for grep and scripts."""
    import os
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty() or "COLUMNS" in os.environ:
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=240)


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
    except Exception as exc:  # click's own usage errors (typer >= 0.29 vendors its own click)
        usage_errors, aborts = _click_error_types()
        if isinstance(exc, usage_errors):
            exc.show()
            sys.exit(exc.exit_code if exc.exit_code else 2)
        if isinstance(exc, aborts):
            print("habu: aborted", file=sys.stderr)
            sys.exit(1)
        raise


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
