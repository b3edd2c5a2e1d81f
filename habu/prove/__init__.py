"""Proofs about plans: hardware rules (z3) and equivalence with the model (finite-field check)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import z3

from habu.lower import LoweredPlan, lower_whole
from habu.plan.plan import Plan

# each kernel kind's interpreter registers its part of the finite-field check (habu.prove.kinds)
from habu.prove import (  # noqa: F401
    interp,
    interp_attention,
    interp_attention_wgmma,
    interp_columns,
    interp_general,
    interp_grouped,
    interp_grouped_wgrad,
    interp_rows,
)
from habu.prove.rules import Obligation, failures, guards, obligations
from habu.prove.verify import Certificate, verify_plan
from habu.spec.ir import Model


@dataclass
class Proof:
    """What was proven about one plan: its rule obligations, its finite-field certificate and the
    lowering both read. The emitter takes a Proof (`habu.paths.emit.emit`) and prints from
    `lowered`, so the CUDA is printed from the objects that were checked."""

    plan: Plan
    obligations: list[Obligation]
    certificate: Certificate | None  # None when a rule already failed
    lowered: LoweredPlan | None = None

    @property
    def violations(self) -> list[Obligation]:
        return failures(self.obligations)

    @property
    def guards(self) -> list[Obligation]:
        return guards(self.obligations)

    @property
    def ok(self) -> bool:
        return not self.violations and self.certificate is not None and self.certificate.passed


def prove(model: Model, plan: Plan, sizes: Mapping[str, int] | None = None, trials: int = 3,
          seeds: list[int] | None = None, witness: bool | None = None) -> Proof:
    """Rules first (cheap); the finite-field check only for a plan that breaks none."""
    lowered = lower_whole(model, plan)
    obs = obligations(model, plan, sizes, lowered=lowered)
    if failures(obs):
        return Proof(plan, obs, None, lowered)
    check_sizes = field_check_sizes(model, plan, sizes, guards(obs))
    cert = verify_plan(model, plan, check_sizes, trials=trials, seeds=seeds, witness=witness,
                       lowerings=list(lowered.kernels))
    return Proof(plan, obs, cert, lowered)


def field_check_sizes(model: Model, plan: Plan, sizes: Mapping[str, int] | None = None,
                      guarded: list[Obligation] | None = None) -> dict[str, int]:
    """The sizes the finite-field check runs at: `sizes`, the plan's shape, and for each runtime extent
    left a witness size within its range (the plan's `ranges` where it has them: a size bucket). A plan whose
    rules hold only under guards (`guarded`: `K % 8 = 0` for 16-byte vectors along a runtime K) is checked where
    they hold: the nearest such sizes to the witnesses (a kernel set sends other sizes to another member)."""
    from habu.plan.buckets import restricted

    out = dict(sizes or {})
    left = [e for e in restricted(model, plan.ranges).extents
            if e.name not in out and e.name not in dict(plan.shape)]
    for e in left:
        out[e.name] = witness_size_for_runtime(e)
    formulas = [o.formula for o in guarded or () if isinstance(o.formula, z3.BoolRef)]
    if left and formulas:
        out.update(_guarded_witness(left, out, formulas, {**dict(plan.shape), **(sizes or {})}))
    return out


def _guarded_witness(left: list, wanted: Mapping[str, int], formulas: list[Any], given: Mapping[str, int]
                     ) -> dict[str, int]:
    """The runtime extents' sizes nearest `wanted` (within their ranges) where every guard formula holds; {} where
    none does (the check then runs at the witnesses, and says what fails there)."""
    opt = z3.Optimize()
    for name, size in given.items():
        opt.add(z3.Int(name) == size)
    distance = []
    for e in left:
        v = z3.Int(e.name)
        opt.add(v >= e.lo, v <= e.hi, *([v % e.multiple == 0] if e.multiple > 1 else []))
        distance.append(z3.If(v >= wanted[e.name], v - wanted[e.name], wanted[e.name] - v))
    opt.add(*formulas)
    opt.minimize(z3.Sum(distance))
    if opt.check() != z3.sat:
        return {}
    found = opt.model()
    return {e.name: found.eval(z3.Int(e.name), model_completion=True).as_long() for e in left}


def witness_size_for_runtime(extent) -> int:
    """A size to run the finite-field check at for a runtime extent: a ragged one near the middle."""
    lo, hi, mult = extent.lo, extent.hi, extent.multiple
    target = min(hi, max(lo, 3 * 128 + 17))
    n = target - target % mult if mult > 1 else target
    return max(lo, n)


__all__ = ["Certificate", "Obligation", "Proof", "field_check_sizes", "prove", "verify_plan"]
