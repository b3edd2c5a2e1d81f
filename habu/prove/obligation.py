"""What a rule produces: an obligation about one kernel of a plan, and the context it is built in."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import z3

from habu.lower.access import Access
from habu.plan.plan import Plan
from habu.prove.deadline import DeadlinePassed, deadline_cut, solver_timeout_ms
from habu.prove.z3_context import check
from habu.spec.dtypes import DTYPES
from habu.spec.ir import Model
from habu.target import Target, target_named

INT31 = 2**31 - 1


@dataclass(frozen=True)
class Rule:
    name: str
    summary: str
    source: str


@dataclass
class Obligation:
    rule: Rule
    kernel: str
    tensor: str | None
    statement: str  # what must hold, in words
    formula: Any  # z3 BoolRef, or a Python bool for purely structural facts
    detail: str = ""  # the offending value, in words, when it fails
    status: str = "open"  # proved, violated, guarded, runtime-check
    counterexample: dict[str, int] | None = None
    how: str = ""

    def describe(self) -> str:
        who = f" ({self.tensor})" if self.tensor else ""
        return f"[{self.rule.name}] {self.kernel}{who}: {self.statement}"


@dataclass
class Context:
    model: Model
    plan: Plan
    target: Target
    ext: dict[str, Any]  # extent name -> z3 Int (or int)
    domain: list[Any]  # constraints on runtime extents
    storage: dict[str, str] = field(default_factory=dict)
    quick: bool = False  # structural rules only: skip building the solver's access formulas

    def dtype_bytes(self, access: Access) -> int:
        return DTYPES[access.dtype].bytes


# the rule every index computed in 32 bits answers to: offsets, and the lanes that feed them
INT32_OFFSETS = Rule("int32-offsets", "offsets, partial products and thread/lane indices fit the index width",
                     "T15: vLLM PR #34279, Liger #1246, Triton #6346")


# ----------------------------------------------------------------------------- discharging


def context(model: Model, plan: Plan, sizes: Mapping[str, int] | None = None) -> Context:
    ext: dict[str, Any] = {}
    domain: list[Any] = []
    given = dict(plan.shape) | dict(sizes or {})
    from habu.plan.buckets import restricted
    from habu.plan.rewrite import planned_model

    for e in restricted(model, plan.ranges).extents:  # a size bucket's plan: its runtime extents' ranges
        if e.name in given:
            ext[e.name] = int(given[e.name])
        else:
            v = z3.Int(e.name)
            ext[e.name] = v
            domain += [v >= e.lo, v <= e.hi]
            if e.multiple > 1:
                domain.append(v % e.multiple == 0)
    return Context(planned_model(model, plan), plan, target_named(plan.target), ext, domain, dict(plan.storage))


def discharge(ob: Obligation, ctx: Context) -> Obligation:
    if ob.status == "runtime-check":
        return ob
    f = ob.formula
    if isinstance(f, bool):
        ob.status = "proved" if f else "violated"
        ob.how = "by construction" if f else "fails"
        return ob
    key = (f.sexpr(), tuple(d.sexpr() for d in ctx.domain))
    known = _DISCHARGED.get(key)
    if known is not None:  # the same formula over the same domain, decided for an earlier plan
        ob.status, how, cex = known
        ob.how, ob.counterexample = f"{how} (the same formula as an earlier plan's)", dict(cex) if cex else None
        return ob
    _solve(ob, f, ctx)
    if len(_DISCHARGED) >= DISCHARGED_KEPT:
        _DISCHARGED.pop(next(iter(_DISCHARGED)))  # the oldest
    _DISCHARGED[key] = (ob.status, ob.how, dict(ob.counterexample) if ob.counterexample else None)
    return ob


# z3's answers by (formula, domain) as text: a search asks the same bounds of many plans that share
# a lowering; the text is the key, so equal keys are the same question
_DISCHARGED: dict[tuple[str, tuple[str, ...]], tuple[str, str, dict[str, int] | None]] = {}
DISCHARGED_KEPT = 50_000


Z3_TIMEOUT_MS = 10_000  # one query's limit (less when the proof's deadline is nearer)


def _solve(ob: Obligation, f: Any, ctx: Context) -> Obligation:
    start = time.perf_counter()
    solver = z3.Solver()
    given = solver_timeout_ms(Z3_TIMEOUT_MS)  # the proof's deadline, when nearer, bounds z3 too
    solver.set("timeout", given)
    solver.add(*ctx.domain)
    solver.add(z3.Not(f))
    result = check(solver)
    ms = (time.perf_counter() - start) * 1000
    if result == z3.unsat:
        ob.status, ob.how = "proved", f"z3: no counterexample ({ms:.0f} ms)"
        return ob
    if result == z3.unknown and deadline_cut(Z3_TIMEOUT_MS, given):
        raise DeadlinePassed(f"the time budget ran out during a z3 query ({ob.rule.name})")
    if result == z3.unknown:
        why = solver.reason_unknown()
        if _nonlinear_retry(f, ctx, ob.rule.name) == z3.unsat:
            ob.status, ob.how = "proved", "z3 (nlsat, after the default solver gave up): no counterexample"
            return ob
        ob.status, ob.how = "violated", f"z3 could not decide it within {Z3_TIMEOUT_MS // 1000} s: {why}"
        return ob
    model = solver.model()
    runtime = {e.name for e in ctx.model.extents if not isinstance(ctx.ext[e.name], int)}
    cex = {}
    for d in model.decls():
        v = model[d]
        if z3.is_int_value(v):
            cex[d.name()] = v.as_long()
    ob.counterexample = cex
    if runtime & set(cex):
        # does some size in the range satisfy it? then it is a guard of a checked kernel set
        probe = z3.Solver()
        probe_ms = solver_timeout_ms(Z3_TIMEOUT_MS)
        probe.set("timeout", probe_ms)
        probe.add(*ctx.domain, f)
        answer = check(probe)
        if answer == z3.unknown and deadline_cut(Z3_TIMEOUT_MS, probe_ms):
            raise DeadlinePassed(f"the time budget ran out during a z3 query ({ob.rule.name})")
        if answer == z3.sat:
            ob.status = "guarded"
            ob.how = "holds only for some runtime sizes: the plan is valid where it holds"
            return ob
    shown = {k: v for k, v in cex.items() if k in runtime}
    ob.status = "violated"
    ob.how = ("z3: counterexample " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items()))) if shown else \
        "z3: violated at this shape"
    return ob


def _nonlinear_retry(f: Any, ctx: Context, rule: str) -> Any:
    """A second opinion when the default solver gives up: z3's nlsat procedure (complete for
    nonlinear real arithmetic) on the same question. Offsets are products of tile coordinates and
    runtime extents (`row·K + k < N·K`), which z3's default integer strategy decides in one version
    and times out on in another (z3 4.15 on `bounds` of a runtime-K TMA plan; 5.4 proves it). Only
    its unsat is used: no real solution means no integer one (integer division is relaxed to real
    constraints with more solutions, not fewer). A sat or unknown leaves the obligation undecided."""
    solver = z3.Then("simplify", "qfnra-nlsat").solver()
    given = solver_timeout_ms(Z3_TIMEOUT_MS)
    solver.set("timeout", given)
    solver.add(*ctx.domain)
    solver.add(z3.Not(f))
    try:
        result = check(solver)
    except z3.Z3Exception:  # a formula outside the fragment the tactic accepts
        return z3.unknown
    if result == z3.unknown and deadline_cut(Z3_TIMEOUT_MS, given):
        raise DeadlinePassed(f"the time budget ran out during a z3 query ({rule})")
    return result


def _surely_false(formula: Any) -> bool:
    """The formula is False: a Python bool, or a z3 formula that simplifies to false (a TMA stride
    at a fixed shape is a z3 term over constants). A formula false for every value of its free
    variables is violated whatever they are; anything less certain is left to the solver."""
    if isinstance(formula, bool):
        return not formula
    return isinstance(formula, z3.BoolRef) and z3.is_false(z3.simplify(formula))
