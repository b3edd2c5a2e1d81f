"""Tuning a model: the one orchestration behind `habu search` and `habu.tune`.

From a .habu file to stored plans and the winner's report: check the options, choose where plans are
proven (this process, local processes or a Ray cluster) and timed (this machine's GPU, the cluster's GPU
pools, or nowhere), run the search once per target, prove each winner once at the full shape, and write
its plan, CUDA, cubin, report (with what was measured), roofline plot and candidate list. What is
printed of the result is the caller's: the command line prints the table (`habu.cli`), the Python API
returns it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from habu.cli_paths import output_dir
from habu.db import PlanDB, Record
from habu.errors import HabuError, UsageError
from habu.plan.buckets import BucketGrid, cell_ranges, describe_ranges, restricted
from habu.plan.plan import Plan
from habu.prove import Proof
from habu.search.budget import Budget, SearchResult
from habu.spec.ir import Model
from habu.target import Target, target_named


@dataclass
class Tuned:
    """One target's search: its result, the winner's proof (proven once, at the full shape) and what
    was written or not made (and why)."""

    target: Target
    result: SearchResult
    db_path: Path
    executor: str  # where the candidates were proven: "inline", "processes" or "ray"
    proof: Proof | None = None  # the winner's; None when no plan was verified
    files: list[Path] = field(default_factory=list)
    not_made: list[str] = field(default_factory=list)  # outputs not written, each with the reason
    ranges: tuple[tuple[str, int, int], ...] = ()  # the size bucket searched (habu/plan/buckets.py), if any

    @property
    def best(self) -> Plan | None:
        return self.result.best


@dataclass
class TuneResult:
    """A tuning run: the model bound to its shape and one `Tuned` per target searched (one per kind of
    GPU in a Ray cluster). `interrupted`: Ctrl-C ended it (what was verified by then is stored)."""

    model: Model
    tuned: list[Tuned]
    interrupted: bool = False

    @property
    def best(self) -> Plan | None:
        """The winner of the first target searched (None when none was verified)."""
        return self.tuned[0].best if self.tuned else None


def tune(path: str | Path, model: str | None = None, *, shape: Mapping[str, int] | None = None,
         target: str | None = None, budget: str | int = "90s", db: str | Path | None = None, top_k: int = 5,
         seed: int = 0, no_gpu: bool = False, jobs: int | None = None, ray: str | None = None,
         out: str | Path | None = None, log: Any = None,
         on_tuned: Callable[[Tuned], None] | None = None) -> TuneResult:
    """Search the plan space of `model` at `shape` within `budget` (a duration such as "90s", "10m",
    "1h", or a number of candidates); keep the best verified plans in the plan database `db`.

    `target`: the GPU architecture (default: this machine's GPU's, `habu.gpu_info.current_arch`);
    `no_gpu`: time nothing, rank by the cost model; `jobs`: local processes proving candidates (1: this
    process); `ray`: a Ray cluster's address ("local", "auto" or HOST:PORT) to prove and time on;
    `out`: the directory for the winner's files (default out/search/<model>); `log`: a rich Console
    for progress and notes (default: stderr); `on_tuned`: called with each target's `Tuned` as soon as
    it is written (before an error about a later one is raised).

    A usage mistake raises `UsageError`; a search that verified no plan, or that lost its cluster,
    raises `HabuError` (once every target searched was reported)."""
    from habu.compile import bind_shape
    from habu.gpu_info import current_arch
    from habu.prove.limits import check_sizes
    from habu.search.tasks import Job
    from habu.spec.parser import load_program

    if log is None:
        from rich.console import Console

        log = Console(stderr=True)
    from habu.spec.grad_program import with_backward

    program = with_backward(load_program(path), model)  # NAME-GRAD: the derived backward of NAME
    m = program.pick(model)
    sizes = dict(shape or {})
    grid = BucketGrid.of(bind_shape(m, sizes))
    missing = [e.name for e in m.extents if not e.is_static and e.name not in sizes and e.name not in grid.extents]
    if missing:
        bucketed = f"; the bucketed row widths ({', '.join(grid.extents)}) may be left out: each bucket is " \
            "searched" if grid.extents else ""
        raise UsageError(f"search tunes one shape: give the runtime extents with --shape ({', '.join(missing)})"
                         + bucketed)
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs takes a positive number, got {jobs}")
    if top_k < 1:
        raise UsageError(f"--top-k takes a positive number, got {top_k}")
    if grid.axes and ray is not None:
        raise UsageError(f"--ray searches one shape: give {', '.join(grid.extents)} with --shape, or search the "
                         "size buckets on this machine (without --ray)")
    bound = bind_shape(m, sizes)
    plan_budget = search_budget(budget)
    out_dir = Path(out) if out is not None else Path("out") / "search" / m.name.lower()
    output_dir(out_dir, "-o")
    arch = target or current_arch()
    check_sizes(bound, bound.sizes, target_named(arch))
    _z3_context()
    if grid.axes:  # a runtime row width: one search per size bucket, each stored under its own key
        return _tune_buckets(path, bound, grid, sizes, arch, plan_budget, db, top_k, seed, no_gpu, jobs, out_dir,
                             log, on_tuned)
    job = Job.of(str(path), bound, {e.name: e.size for e in bound.extents}, arch)
    if ray is not None:
        executor, runs, cleanup = _ray_runs(log, ray, job, target, no_gpu)
    else:
        from habu.search.pool import local_executor

        executor, cleanup = local_executor(jobs), None
        runs = [(target_named(arch), None if no_gpu else _local_timer(log, Path(path), m, sizes))]
    share = Budget(plan_budget.seconds / len(runs), None) if plan_budget.seconds and len(runs) > 1 else plan_budget
    done = TuneResult(bound, [])
    unverified: list[str] = []

    def leave() -> None:
        nonlocal cleanup
        if cleanup is not None:
            cleanup()
            cleanup = None

    try:
        for tgt, timer in runs:
            result, db_path = _search(path, bound, tgt, sizes, db, share, timer, top_k, seed, log, executor,
                                      on_lost=leave)
            tuned = Tuned(tgt, result, db_path, executor.name)
            if result.best is None:
                log.print(f"[yellow]{_why_nothing(result, plan_budget)}: nothing stored in {db_path} for "
                          f"{m.name} on {tgt.name}[/]", highlight=False)
                unverified.append(tgt.name)
            else:
                where = out_dir / re.sub(r"[^A-Za-z0-9_.-]+", "-", result.key.target.gpu) if len(runs) > 1 else out_dir
                _write_winner_unless_skipped(tuned, bound, sizes, where, log)
            done.tuned.append(tuned)
            if on_tuned is not None:
                on_tuned(tuned)
            if result.lost is not None:  # the report (when a plan was proven) is written above
                stored = f"the best plan proven so far is stored in {db_path}" if result.best is not None \
                    else "no plan was proven by then: nothing was stored"
                raise HabuError(f"the search ended early: {result.lost}; {stored}")
            if result.interrupted:
                done.interrupted = True
                return done
    finally:
        executor.close()
        leave()
    if unverified:
        raise HabuError(f"the search verified no plan for {m.name} on {', '.join(unverified)}; nothing was stored "
                        "(give it a larger --budget)")
    return done


@dataclass
class PolicyRun:
    """One save policy's backward search (habu.spec.grad_save.SavePolicy): the backward model it tuned, and
    its cost: the backward's winners (measured medians, or the cost model's predictions when any policy
    went unmeasured) plus the forward's extra writes of the values this policy saves, at the target's
    memory bandwidth (recomputing costs the forward nothing)."""

    mode: str
    name: str  # the backward model's name (habu.spec.grad_program.backward_name): its plan-database key
    result: TuneResult | None  # None: the same backward model as `same_as`'s, searched once
    saved_bytes: int = 0  # what the forward writes of saved values (f32), summed over the size buckets
    same_as: str | None = None
    backward_us: float | None = None
    forward_us: float = 0.0

    @property
    def total_us(self) -> float | None:
        return None if self.backward_us is None else self.backward_us + self.forward_us


@dataclass
class PolicyChoice:
    """A backward search over the save policies: each policy's run and the fastest proven one."""

    runs: list[PolicyRun]
    measured: bool  # compared by GPU medians (else by the cost model)

    @property
    def interrupted(self) -> bool:
        return any(r.result is not None and r.result.interrupted for r in self.runs)

    @property
    def best(self) -> PolicyRun | None:
        timed = [r for r in self.runs if r.total_us is not None]
        return min(timed, key=lambda r: r.total_us) if timed else None  # type: ignore[arg-type, return-value]

    def describe(self) -> str:
        best = self.best
        how = "measured" if self.measured else "predicted by the cost model"
        parts = []
        for r in self.runs:
            if r.same_as is not None:
                parts.append(f"{r.mode}: the same backward as {r.same_as}")
            elif r.total_us is None:
                parts.append(f"{r.mode}: no plan verified")
            else:
                parts.append(f"{r.mode}: {r.total_us:.1f} µs (backward {r.backward_us:.1f} + the forward's saved "
                             f"writes {r.forward_us:.2f})")
        head = f"save policy {best.mode} is fastest ({best.name}; {how})" if best is not None \
            else "no save policy verified a plan"
        return head + ": " + "; ".join(parts)


def tune_backward(path: str | Path, model: str | None = None, *, modes: list[str] | None = None,
                  shape: Mapping[str, int] | None = None, target: str | None = None, budget: str | int = "90s",
                  log: Any = None, on_tuned: Callable[[Tuned], None] | None = None, **options: Any) -> PolicyChoice:
    """Search the derived backward of `model` once per save policy (`modes`, default every SaveMode: the
    plan space's save-or-recompute dimension), the budget shared equally, each stored under its own
    backward name; policies whose backward models are the same are searched once. Returns each policy's
    cost and the fastest proven one (`PolicyChoice.best`). `options` are `tune`'s."""
    from habu.compile import bind_shape
    from habu.gpu_info import current_arch
    from habu.spec.grad_program import backward_name, derive_model, with_backward
    from habu.spec.grad_save import SaveMode, SavePolicy
    from habu.spec.parser import load_program

    program = load_program(path)
    forward = program.pick(model).name
    wanted = [SaveMode(m) for m in (modes or [m.value for m in SaveMode])]
    models = {}
    runs: list[PolicyRun] = []
    seen: dict[str, str] = {}
    for mode in wanted:  # policies that derive the same backward model are searched once
        name = backward_name(forward, mode.value)
        models[mode.value] = bw_model = with_backward(program, name).model(name)
        digest = bw_model.canonical_hash()
        runs.append(PolicyRun(mode.value, name, None, same_as=seen.get(digest)))
        seen.setdefault(digest, mode.value)
    searched = [r for r in runs if r.same_as is None]
    plan_budget = search_budget(budget)
    share = f"{max(1, int(plan_budget.seconds // len(searched)))}s" if plan_budget.seconds else \
        str(max(1, (plan_budget.trials or 1) // len(searched)))
    tgt = target_named(target or current_arch())
    for run in searched:
        if log is not None:
            log.print(f"save policy {run.mode}: searching {run.name}", highlight=False)
        try:
            out = options.get("out")  # each policy's winner in a folder of its own
            run.result = tune(path, run.name, shape=shape, target=target, budget=share, log=log, on_tuned=on_tuned,
                              **(options | {"out": Path(out) / run.mode if out is not None else None}))
        except UsageError:
            raise
        except HabuError as err:  # this policy verified nothing: the others still compete
            if log is not None:
                log.print(f"[yellow]save policy {run.mode}: {err.message}[/]", highlight=False)
            continue
        bw_model = models[run.mode]
        bound = bind_shape(bw_model, dict(shape or {}))
        saved = derive_model(program, forward, None, SavePolicy(SaveMode(run.mode))).saved
        for t in run.result.tuned:
            sizes = {e.name: e.size for e in bound.extents if e.is_static} | dict(shape or {}) \
                | {n: hi for n, _, hi in t.ranges}
            for t_name, s in saved:
                if t_name == s:
                    continue  # a forward output the backward reads: stored whatever the policy
                n = 4  # saved values are f32
                for e in bw_model.tensor(s).extents:
                    n *= sizes.get(e, 0)
                run.saved_bytes += n
        if run.result.interrupted:
            break
    records = [winner_record(t.result) for r in runs if r.result is not None for t in r.result.tuned]
    measured = bool(records) and all(rec is not None and rec.median_us for rec in records)
    for r in runs:
        if r.result is None:
            continue
        times = [winner_record(t.result) for t in r.result.tuned]
        if times and all(rec is not None for rec in times):
            r.backward_us = sum((rec.median_us if measured else rec.predicted_us) or 0.0  # type: ignore[union-attr]
                                for rec in times)
            r.forward_us = r.saved_bytes / tgt.ceilings.bandwidth * 1e6
    return PolicyChoice(runs, measured)


def _tune_buckets(path, bound: Model, grid: BucketGrid, sizes: dict[str, int], arch: str, budget: Budget, db,
                  top_k: int, seed: int, no_gpu: bool, jobs: int | None, out_dir: Path, log,
                  on_tuned: Callable[[Tuned], None] | None) -> TuneResult:
    """One search per size bucket of the bucketed runtime extents (habu/plan/buckets.py), on this
    machine, each with an equal share of the budget: its plans keep the bucket's extents runtime ones,
    proven for the bucket's sizes (`ranges`), costed and timed at the bucket's largest size, and stored
    under the bucket's key; the winner's files go to OUT/<extent>-<lo>-<hi>."""
    from habu.search.pool import local_executor

    cells = [cell_ranges(c) for c in grid.cells()]
    share = Budget(budget.seconds / len(cells) if budget.seconds else None,
                   max(1, budget.trials // len(cells)) if budget.trials else None)
    tgt = target_named(arch)
    done = TuneResult(bound, [])
    unverified: list[str] = []
    executor = local_executor(jobs)
    try:
        for ranges in cells:
            at = sizes | {name: hi for name, _, hi in ranges}  # the bucket's widest: costed and timed there
            cell_model = restricted(bound, ranges)
            log.print(f"size bucket {describe_ranges(ranges)} (timed at "
                      f"{', '.join(f'{n}={hi}' for n, _, hi in ranges)})", highlight=False)
            timer = None if no_gpu else _local_timer(log, Path(path), bound, at)
            try:
                result, db_path = _search(path, cell_model, tgt, at, db, share, timer, top_k, seed, log, executor,
                                          on_lost=lambda: None, ranges=ranges)
            finally:
                if timer is not None:
                    timer.close()
            tuned = Tuned(tgt, result, db_path, executor.name, ranges=ranges)
            if result.best is None:
                log.print(f"[yellow]{_why_nothing(result, budget)}: nothing stored in {db_path} for "
                          f"{bound.name} {describe_ranges(ranges)}[/]", highlight=False)
                unverified.append(describe_ranges(ranges))
            else:
                where = out_dir / "-".join(f"{n}{lo}-{hi}" for n, lo, hi in ranges)
                _write_winner_unless_skipped(tuned, cell_model, {k: v for k, v in at.items() if k in sizes}, where, log)
            done.tuned.append(tuned)
            if on_tuned is not None:
                on_tuned(tuned)
            if result.interrupted:
                done.interrupted = True
                return done
    finally:
        executor.close()
    if unverified:
        raise HabuError(f"the search verified no plan for {bound.name} in the size bucket(s) {'; '.join(unverified)}; "
                        "nothing was stored for them (give it a larger --budget)")
    return done


def _z3_context() -> None:
    """Make z3's context now, before any Ctrl-C is taken as the end of the search: the driver's first
    rule check makes it otherwise, and an interrupt that landed while z3 built it left a half-made
    context whose finaliser printed a traceback ("Exception ignored in: Context.__del__") under
    `habu: interrupted` (tests/search/test_search.py, Ctrl-C before the first proof, failed 3 of 4)."""
    import z3

    z3.main_ctx()


def search_budget(budget: str | int) -> Budget:
    """A search's budget from its text (90s, 10m, 1h, 1h30m, or a number of candidates); it must be positive."""
    parsed = Budget.parse(str(budget))
    if (parsed.seconds is not None and parsed.seconds <= 0) or (parsed.trials is not None and parsed.trials <= 0):
        raise UsageError(f"--budget {budget}: the search needs a positive budget (90s, 10m, 1h or a number of "
                         "candidates)")
    return parsed


def _search(path, bound: Model, tgt: Target, sizes: dict[str, int], db, budget: Budget, timer, top_k: int,
            seed: int, log, executor, on_lost: Callable[[], None],
            ranges: tuple[tuple[str, int, int], ...] = ()) -> tuple[SearchResult, Path]:
    """One target's search (of one size bucket: `ranges`), with its progress line; `on_lost` runs at
    once when the cluster is lost."""
    from habu.search.loop import Search
    from habu.search.report import Progress

    with PlanDB(db) as plans, Progress(budget, log) as progress:
        s = Search(str(path), bound, tgt, sizes, plans, budget, timer, top_k, seed, progress, executor, ranges)
        result = s.run()
        if result.lost is not None:
            on_lost()  # disconnect first: Ray's driver would end this process before the report
        progress(result.stats)
        return result, plans.path


def _why_nothing(result: SearchResult, budget: Budget) -> str:
    """Why a search stored no plan."""
    if result.lost is not None:
        return "the search ended before any plan was verified"
    why = "interrupted before any plan was verified" if result.interrupted else \
        f"no plan was verified within the budget ({budget.describe()})"
    if result.stats.abandoned:
        why += f"; {result.stats.abandoned} proof(s) still running at its end were abandoned"
    return why


def winner_record(result: SearchResult) -> Record | None:
    """The stored record of the search's winner (the entry may also hold plans of earlier searches,
    ranked above it)."""
    if result.best is None:
        return None
    plan = result.best.to_json()
    return next((r for r in result.records if r.plan == plan), None)


def _write_winner_unless_skipped(tuned: Tuned, bound: Model, sizes: dict[str, int], out_dir: Path, log) -> None:
    """`_write_winner`. After a Ctrl-C its full-shape proof still runs (seconds at GGEMM 4096³): the user is
    told so, and a second Ctrl-C skips the files (the plan stays stored, proven as the search proved it)."""
    result = tuned.result
    if not result.interrupted:
        _write_winner(tuned, bound, sizes, out_dir, log)
        return
    try:  # the notice inside: a Ctrl-C the moment it is read is still a skip
        log.print(f"interrupted: proving the winner at the full shape before writing its files (Ctrl-C again "
                  f"skips them; the plan is stored in {tuned.db_path})", highlight=False)
        _write_winner(tuned, bound, sizes, out_dir, log)
    except KeyboardInterrupt:
        assert result.best is not None
        log.print(f"files not written: plan {result.best.key} is stored in {tuned.db_path} (habu run and habu.load "
                  "find it there)", highlight=False)


def _write_winner(tuned: Tuned, bound: Model, sizes: dict[str, int], out_dir: Path, log) -> None:
    """Prove the winner once, at the full shape with three trials (the search checked each candidate
    with one trial, on a witness shape: docs/VERIFY.md), and write its plan, CUDA, cubin, report (with
    its measurement), certificate, roofline plot and candidate list."""
    from habu.compile import Compiled, Measured, write_outputs
    from habu.prove import prove
    from habu.search.cost import compute_peak
    from habu.search.report import roofline_plot, write_candidates

    result, tgt = tuned.result, tuned.target
    assert result.best is not None
    proof = prove(bound, result.best, sizes, trials=3)
    if not proof.ok:
        why = proof.violations[0].describe() if proof.violations else \
            proof.certificate.failure if proof.certificate is not None else "the finite-field check did not run"
        raise HabuError(f"the winner of the search for {bound.name}, plan {result.best.key}, failed its full-shape "
                        f"proof: {why} (a Habu defect: please report it with the plan)")
    tuned.proof = proof
    st, best = result.stats, winner_record(result)
    measured = None
    if best is not None and best.median_us and st.roofline_us:
        measured = Measured(best.median_us, best.p20_us, best.p80_us, st.roofline_us, st.baseline, st.baseline_us)
    tuned.files = write_outputs(out_dir, bound, Compiled(bound, [result.best], [proof]), tgt, measured)
    if not result.measured:
        _not_made(tuned, log, "no roofline.png: nothing was timed (no GPU), so there is nothing to plot")
        return
    c = tgt.ceilings
    png = roofline_plot(result, out_dir / "roofline.png", compute_peak(c), c.bandwidth)
    if png is None:
        _not_made(tuned, log, "no roofline.png: matplotlib is not installed (pip install matplotlib)")
    else:
        tuned.files.append(png)
    tuned.files.append(write_candidates(result, out_dir / "candidates.csv"))


def _not_made(tuned: Tuned, log, why: str) -> None:
    tuned.not_made.append(why)
    log.print(why, highlight=False)


def _local_timer(log, file: Path, m: Model, sizes: dict[str, int]):
    """The timing worker on this machine's GPU, or None (said plainly) when there is none."""
    from habu.timing.worker import GpuTimer

    timer = GpuTimer(str(file), m.name, sizes)
    log.print(f"starting the timing worker on the GPU for {m.name} ...", highlight=False)
    if timer.start() is None:
        log.print(f"[yellow]nothing will be timed: {timer.unavailable or 'no GPU found'}; "
                  "candidates are ranked by the cost model and the winner is stored as unmeasured[/]")
        return None
    log.print(f"timing on {timer.info['gpu']} ({timer.info['sm_count']} SMs)", highlight=False)
    return timer


def _ray_runs(log, address: str, job, target: str | None, no_gpu: bool):
    """The Ray executor, one (target, GPU pool) run per kind of GPU in the cluster, and how to leave it."""
    from habu.cluster.ray_pool import ClusterWatch, RayExecutor, connect, gpu_pools, ray_module
    from habu.target import TARGETS

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
    log.print(f"Ray cluster: {len(ray.nodes())} node(s), {int(resources.get('CPU', 0))} CPUs, "
              f"{int(resources.get('GPU', 0))} GPUs", highlight=False)
    pools, problems = ([], []) if no_gpu else gpu_pools(job)
    for p in problems:
        log.print(f"[yellow]a GPU actor could not start: {p}[/]", highlight=False)
    runs = []
    for pool in pools:
        arch = pool.info.get("arch")
        if (target is not None and arch != target) or arch not in TARGETS:
            log.print(f"[yellow]skipping {len(pool.actors)} {pool.info.get('gpu')} GPU(s): they run {arch}, "
                      f"the search is for {target or 'a known target'}[/]", highlight=False)
            pool.close()
            continue
        log.print(f"timing on {len(pool.actors)} × {pool.info['gpu']} ({pool.info['sm_count']} SMs)",
                  highlight=False)
        runs.append((target_named(arch), pool))
    if not runs:
        if not no_gpu:
            log.print("[yellow]nothing will be timed: the cluster has no usable GPU; candidates are ranked by "
                      "the cost model and the winner is stored as unmeasured[/]")
        runs = [(target_named(job.target), None)]
    return executor, runs, cleanup


__all__ = ["PolicyChoice", "PolicyRun", "TuneResult", "Tuned", "search_budget", "tune", "tune_backward", "winner_record"]
