"""The `habu` command line."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from habu.cli_kernels import emit, export
from habu.cli_options import FileArg, MachineTargetOpt, PinOpt, ShapeOpt, parse_shape
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
    from habu.api import current_target

    tgt = target_named(target or current_target())
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
) -> None:
    """Search the plan space within a budget; keep the best verified plans in the plan database."""

    from habu.api import current_target
    from habu.cli_paths import output_dir
    from habu.compile import bind_shape
    from habu.db import PlanDB
    from habu.search.loop import Budget, Search
    from habu.search.pool import local_executor
    from habu.search.report import Progress
    from habu.search.tasks import Job
    from habu.spec.parser import load_program
    from habu.target import target_named

    console = output_console(stderr=True)  # progress and logs; the results go to stdout
    results = output_console()
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
    if (plan_budget.seconds is not None and plan_budget.seconds <= 0) or \
            (plan_budget.trials is not None and plan_budget.trials <= 0):
        raise UsageError(f"--budget {budget}: the search needs a positive budget (90s, 10m, 1h or a number of "
                         "candidates)")
    out_dir = out or Path("out") / "search" / m.name.lower()
    output_dir(out_dir, "-o")
    from habu.prove.limits import check_sizes

    check_sizes(bound, bound.sizes, target_named(target or current_target()))
    job = Job.of(str(file), bound, {e.name: e.size for e in bound.extents}, target or current_target())
    if ray is not None:
        executor, runs, cleanup = _ray_runs(console, ray, job, target, no_gpu)
    else:
        executor, cleanup = local_executor(jobs), None
        runs = [(target_named(target or current_target()), None if no_gpu else _local_timer(console, file, m, sizes))]
    unverified: list[str] = []
    try:
        share = Budget(plan_budget.seconds / len(runs), None) if plan_budget.seconds and len(runs) > 1 else plan_budget
        for tgt, timer in runs:
            with PlanDB(db) as plans, Progress(share, console) as progress:
                s = Search(str(file), bound, tgt, sizes, plans, share, timer, top_k, seed, progress, executor)
                result = s.run()
                if result.lost is not None and cleanup is not None:
                    cleanup()  # disconnect first: Ray's driver would end this process before the report
                    cleanup = None
                progress(result.stats)
                if result.best is None:
                    why = "interrupted before any plan was verified" if result.interrupted else \
                        f"no plan was verified within the budget ({plan_budget.describe()})"
                    if result.stats.abandoned:
                        why += f"; {result.stats.abandoned} proof(s) still running at its end were abandoned"
                    if result.lost is not None:
                        why = "the search ended before any plan was verified"
                    console.print(f"[yellow]{why}: nothing stored in {plans.path} for {m.name} on {tgt.name}[/]",
                                  highlight=False)
                    unverified.append(tgt.name)
                else:
                    _report_search(results, result, plans.path, bound, sizes, tgt, out_dir, executor.name,
                                   len(runs) > 1, console)
            if result.lost is not None:  # the report (when a plan was proven) is written above
                stored = f"the best plan proven so far is stored in {plans.path}" if result.best is not None \
                    else "no plan was proven by then: nothing was stored"
                raise HabuError(f"the search ended early: {result.lost}; {stored}")
            if result.interrupted:
                stored = " (the plans verified so far are stored)" if result.best is not None else ""
                console.print(f"habu: interrupted{stored}", highlight=False)
                raise typer.Exit(130)
    finally:
        executor.close()
        if cleanup is not None:
            cleanup()
    if unverified:
        raise HabuError(f"the search verified no plan for {m.name} on {', '.join(unverified)}; nothing was stored "
                        "(give it a larger --budget)")


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
    from habu.cluster.ray_pool import ClusterWatch, RayExecutor, connect, gpu_pools, ray_module
    from habu.target import TARGETS, target_named

    connect(address)
    ray = ray_module()
    watch = ClusterWatch.of_this_driver()  # a head or raylet lost ends the search with a message

    def cleanup() -> None:
        """Leave the cluster. After a loss, at once and waiting at most 5 s: Ray's driver exits
        (status 1, nothing said) soon after the GCS marks its node dead, unless disconnected."""
        import threading

        watch.stop()
        if not ray.is_initialized():
            return
        leave = threading.Thread(target=ray.shutdown, daemon=True)
        leave.start()
        leave.join(timeout=5.0)

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
    return executor, runs, cleanup


def _report_search(console, result, db_path, bound, sizes, tgt, out_dir: Path, executor: str,
                   per_gpu: bool = False, log=None) -> None:
    """The table of the best plans, the winner's report, CUDA and roofline plot, on `console` (stdout);
    notes about what was not made on `log` (stderr)."""
    log = log or console
    from habu.compile import Compiled, write_outputs
    from habu.prove import prove
    from habu.search.cost import compute_peak
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
    if not result.measured:
        console.print(PREDICTION_NOTE, highlight=False)
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
    c = tgt.ceilings
    png = None
    if not result.measured:
        log.print("no roofline.png: nothing was timed (no GPU), so there is nothing to plot", highlight=False)
    else:
        png = roofline_plot(result, out_dir / "roofline.png", compute_peak(c), c.bandwidth)
        if png is None:
            log.print("no roofline.png: matplotlib is not installed (pip install matplotlib)", highlight=False)
    timed = [write_candidates(result, out_dir / "candidates.csv")] if result.measured else []
    console.print("wrote " + ", ".join(str(f) for f in [*files, *([png] if png else []), *timed]), highlight=False)


app.command()(emit)
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
        raise
    if isinstance(status, int) and status:
        sys.exit(status)


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
