"""The work one candidate needs away from the search driver: the z3 obligations, the finite-field
check and (when it will be timed, or without a GPU when it would become the best) the NVRTC
compile. Pure functions of picklable arguments, so a thread, a local process pool or a Ray task on
another machine runs the same code and gives the same answer; the driver alone decides what is kept
and writes the plan database.

A `Job` carries the model as source text (a remote worker has no copy of the user's file) with its
sizes; each worker parses it once and keeps it.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from habu.emit_cuda.cache import prefill_cache
from habu.lower import LoweredPlan
from habu.plan.plan import Plan
from habu.spec.ir import Model

T = TypeVar("T")


@dataclass(frozen=True)
class Job:
    """One search: the model (source text, name, sizes) and the target its plans are for."""

    source: str
    source_name: str  # the file name, for messages
    model: str
    sizes: tuple[tuple[str, int], ...]  # every extent, bound
    target: str

    @staticmethod
    def of(path: str, model: Model, sizes: dict[str, int], target: str) -> Job:
        from pathlib import Path

        text = Path(path).read_text()
        return Job(text, str(path), model.name, tuple(sorted((k, int(v)) for k, v in sizes.items())), target)


@functools.lru_cache(maxsize=8)
def bound_model(job: Job) -> Model:
    from habu.spec.grad_program import with_backward
    from habu.spec.parser import parse_text

    program = with_backward(parse_text(job.source, job.source_name), job.model)  # a derived backward by name
    return program.models[job.model].with_sizes(dict(job.sizes))


FIELD_CHECKS: dict[str, dict[str, Any]] = {}  # field key -> certificate (JSON), in this process
FIELD_CHECKS_KEPT = 20000


def _remember(key: str, cert_json: dict[str, Any]) -> None:
    if len(FIELD_CHECKS) >= FIELD_CHECKS_KEPT:
        FIELD_CHECKS.pop(next(iter(FIELD_CHECKS)))  # the oldest
    FIELD_CHECKS[key] = cert_json


def check_candidate(job: Job, plan_json: dict, seed: int, only: tuple[int, ...] | None = None,
                    compile_kernels: bool = False, deadline: float | None = None,
                    clean_only: bool = False) -> dict[str, Any]:
    """Prove one plan; compile it when asked and proven (`compile_kernels`: its cubins come back to be
    timed; `clean_only`: compiled to read ptxas's report, for a search without a GPU). Never raises
    for a bad plan: the result's `status` is "verified", "rules" (a z3 obligation fails), "field"
    (the finite-field check fails), "compile" (NVRTC refuses it), "slow" (`clean_only`: ptxas
    spilled registers or serialized the wgmma of one of its kernels: correct, and slow where no
    timing can say so), "lost" (Habu itself failed on it) or "abandoned" (the search's time budget
    ended at `deadline`, time.time() seconds, before the proof did), with the reason."""
    from habu.prove.deadline import DeadlinePassed, proof_deadline

    if deadline is not None and time.time() >= deadline:
        return {"status": "abandoned", "reason": "the time budget ran out before its proof started", "seconds": {}}
    try:
        with proof_deadline(deadline):
            return _check_candidate(job, plan_json, seed, only, compile_kernels, clean_only)
    except DeadlinePassed as stop:
        return {"status": "abandoned", "reason": str(stop), "seconds": {}}
    except MemoryError as exc:  # a shape the size limits let through, but not this machine's memory
        return {"status": "lost", "seconds": {}, "reason": f"out of memory while checking this plan: {exc}"}
    except Exception as exc:  # a defect in Habu, not in the plan: reported with the plan, the search goes on
        import traceback

        where = traceback.extract_tb(exc.__traceback__)[-1]
        return {"status": "lost", "seconds": {},
                "reason": f"internal error while checking this plan: {type(exc).__name__}: {str(exc)[:500]} "
                          f"(at {where.filename.rsplit('/', 1)[-1]}:{where.lineno}; a Habu defect: please report "
                          "it with the plan)"}


def _check_candidate(job: Job, plan_json: dict, seed: int, only: tuple[int, ...] | None,
                     compile_kernels: bool, clean_only: bool = False) -> dict[str, Any]:
    from habu.lower import lower_whole
    from habu.plan.buckets import describe_ranges
    from habu.prove import field_check_sizes
    from habu.prove.deadline import DeadlinePassed
    from habu.prove.rules import failures, guards, obligations
    from habu.prove.verify import field_key, verify_plan

    seconds: dict[str, float] = {}  # each step's wall time, for the search's account of where time goes
    began = time.perf_counter()

    def lap(step: str) -> dict[str, float]:
        nonlocal began
        now = time.perf_counter()
        seconds[step] = now - began
        began = now
        return seconds

    model = bound_model(job)
    sizes = dict(job.sizes)
    plan = Plan.from_json(plan_json)
    lowered = lower_whole(model, plan)  # one lowering: the rules and the field check read it, the emitter prints it
    obs = obligations(model, plan, sizes, set(only) if only is not None else None, lowered)
    # a size bucket's candidate (its width a runtime extent) must hold at every size of its bucket: one
    # that holds only under a guard is refused (the search stores plans without guards)
    broken = failures(obs) or guards(obs)
    lap("rules")
    if broken:
        b = broken[0]
        why = f"holds only where {b.formula}, not at every size of {describe_ranges(plan.ranges)}" \
            if b.status == "guarded" else b.how
        return {"status": "rules", "reason": f"{b.describe()}: {why}", "seconds": seconds}
    # one trial on a witness shape (every tile class, z3-checked coverage); the winner is proven
    # again at the full shape with three trials before it is reported. Plans that differ only in
    # what the check does not read (stages, warps, the instruction, TMA or cp.async, the store)
    # share one check in this process
    lowerings = list(lowered.kernels)
    sizes = field_check_sizes(model, plan, sizes)  # a size bucket's extent: a witness size within it
    key = field_key(model, plan, sizes, lowerings)
    cert_json = FIELD_CHECKS.get(key)
    shared = cert_json is not None
    if cert_json is None:
        cert = verify_plan(model, plan, sizes, trials=1, seeds=[seed], witness=True, lowerings=lowerings)
        cert_json = cert.to_json()
        _remember(key, cert_json)
    else:
        # the check of a plan with the same field key is this plan's check too: bound to this plan
        cert_json = {**cert_json, "plan_key": plan.key, "notes": [*cert_json.get("notes", []),
                                            "the same check as an earlier plan with this lowering (field key "
                                            f"{key[:12]})"]}
    lap("field")
    if not cert_json["passed"]:
        return {"status": "field", "reason": f"finite-field check: {cert_json['failure']}", "seconds": seconds,
                "field_shared": shared}
    out: dict[str, Any] = {"status": "verified", "certificate": cert_json, "seconds": seconds, "field_shared": shared}
    if compile_kernels or clean_only:
        try:
            cubins = bounded_compile(lambda: compile_plan(model, plan, lowered))
        except DeadlinePassed:
            raise  # abandoned, not a compile failure
        except Exception as exc:  # NVRTC's log says why (or that it did not finish)
            return {"status": "compile", "reason": f"{type(exc).__name__}: {str(exc)[:1500]}",
                    "certificate": cert_json, "seconds": lap("compile"), "field_shared": shared}
        lap("compile")
        if compile_kernels:
            out["cubins"] = cubins
        looped = {i for i, k in enumerate(plan.kernels) if k.kind in ACCUMULATING_KINDS} if clean_only else set()
        if clean_only and (flawed := slow_kernels(cubins, only, looped)):
            return {"status": "slow", "reason": "; ".join(flawed), "certificate": cert_json, "seconds": seconds,
                    "field_shared": shared}
    return out


# the kernel kinds with a main loop over k (or KV) tiles whose accumulators and fragments live in
# registers: a spill there is local-memory traffic in every step. A row, map, column or general kernel
# streams memory; a small spill of one was measured harmless (softmax backward at 8192 × 16384: the
# default, 96 B spilled under two blocks an SM, runs at 96% of copy bandwidth, docs/PERF.md).
ACCUMULATING_KINDS = frozenset({"contraction", "grouped", "attention"})


def slow_kernels(cubins: list[tuple[str, Any]], only: tuple[int, ...] | None = None,
                 spills_count: set[int] | None = None) -> list[str]:
    """What ptxas's report says makes a compiled kernel slow whatever a GPU would measure: wgmma
    instructions it serialized (a wait after each, no overlap of the tensor cores with anything), or
    spilled registers in a kernel of `spills_count` (None: any). One line per such kernel, among
    `only` (the plan kernels the candidate changes; None: all), named by the entry ptxas reported on."""
    from habu.emit_cuda.nvrtc import entry_names
    from habu.paths.emit import plan_kernel_index

    flawed = []
    for _key, cubin in cubins:
        r = cubin.resources
        name = next(iter(entry_names(cubin.log)), "")
        i = plan_kernel_index(name)
        if only is not None and i is not None and i not in only:
            continue
        if r.wgmma_serialized or (r.spills and (spills_count is None or i is None or i in spills_count)):
            flawed.append(f"{name or 'a kernel'}: ptxas: {r.describe()}")
    return flawed


# the longest one candidate's NVRTC compiles may take (the slowest plans compile in about 20 s on a
# loaded 2-core machine); a compile still running then is left behind, and the candidate fails
COMPILE_TIMEOUT_S = 300.0


class CompileTimeout(RuntimeError):
    """NVRTC did not finish a candidate's compile in time."""


def bounded_compile(compile_: Callable[[], T], limit_s: float | None = None) -> T:
    """`compile_()` in a thread of its own, waited for at most `limit_s` (COMPILE_TIMEOUT_S) or until
    the proof's deadline. NVRTC is one C call that cannot be interrupted (it releases the GIL): a
    compile that hangs is left running in its daemon thread and the search goes on, instead of
    waiting for it. Past the deadline: `DeadlinePassed` (the candidate is abandoned); past the limit:
    `CompileTimeout` (the candidate failed to compile)."""
    from habu.prove.deadline import DeadlinePassed, seconds_left

    limit = COMPILE_TIMEOUT_S if limit_s is None else limit_s
    left = seconds_left()
    wait = limit if left is None else max(0.0, min(limit, left))
    done: dict[str, Any] = {}

    def run() -> None:
        try:
            done["value"] = compile_()
        except BaseException as exc:  # handed to the waiting thread
            done["error"] = exc

    worker = threading.Thread(target=run, name="habu-nvrtc", daemon=True)
    worker.start()
    worker.join(wait)
    if worker.is_alive():
        if left is not None and wait < limit:
            raise DeadlinePassed("the time budget ran out during its NVRTC compile")
        raise CompileTimeout(f"NVRTC did not finish within {limit:.0f} s (the compile was left behind)")
    if "error" in done:
        raise done["error"]
    return done["value"]


@functools.cache
def compiles_here(target: str) -> bool:
    """NVRTC (or nvcc) is on this machine and compiles for `target`: ptxas's report can be read."""
    from habu.emit_cuda.nvrtc import CompilerUnavailable, compiler_version
    from habu.targets import nvrtc_arch

    try:
        compiler_version()
    except CompilerUnavailable:
        return False
    return nvrtc_arch(target) is not None


def compile_plan(model: Model, plan: Plan, lowered: LoweredPlan | None = None) -> list[tuple[str, Any]]:
    """Every kernel of the plan compiled (through this machine's cache): (cache key, Cubin) pairs
    that a GPU machine stores in its own cache, so it loads instead of compiling. `lowered`: the
    lowering the candidate's rules and finite-field check read, printed as is."""
    from habu.emit_cuda.cache import compile_entry
    from habu.lower import lower_whole
    from habu.paths.emit import emit_lowered
    from habu.target import target_named

    emitted = emit_lowered(lowered or lower_whole(model, plan), plan, target_named(plan.target))
    out = []
    for k in emitted.kernels:
        key, cubin, _hit = compile_entry(k.source, k.name, plan.target)
        k.check_registers(cubin.resources.registers)
        out.append((key, cubin))
    return out


__all__ = ["ACCUMULATING_KINDS", "Job", "bound_model", "check_candidate", "check_candidate_niced", "compile_plan",
           "compiles_here", "lower_priority", "prefill_cache", "slow_kernels"]


def lower_priority() -> None:
    """Run this worker process below the driver and the GPU timing workers (nice 10): proofs and
    compiles fill every CPU, and a timing process that waits for a CPU leaves gaps in the GPU's
    queue that its events would count."""
    import contextlib
    import os

    with contextlib.suppress(OSError, AttributeError):  # absolute, so calling it again changes nothing
        os.setpriority(os.PRIO_PROCESS, 0, max(10, os.getpriority(os.PRIO_PROCESS, 0)))


def check_candidate_niced(job: Job, plan_json: dict, seed: int, only: tuple[int, ...] | None = None,
                          compile_kernels: bool = False, deadline: float | None = None,
                          clean_only: bool = False) -> dict:
    """`check_candidate` in a worker process of its own (a Ray task), at lower priority."""
    lower_priority()
    return check_candidate(job, plan_json, seed, only, compile_kernels, deadline, clean_only)

