"""Proofs about plans: hardware rules (z3) and equivalence with the model (finite-field check)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

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
    check_sizes = field_check_sizes(model, plan, sizes)
    cert = verify_plan(model, plan, check_sizes, trials=trials, seeds=seeds, witness=witness,
                       lowerings=list(lowered.kernels))
    return Proof(plan, obs, cert, lowered)


def field_check_sizes(model: Model, plan: Plan, sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """The sizes the finite-field check runs at: `sizes`, the plan's shape, and for each runtime extent
    left a witness size within its range (the plan's `ranges` where it has them: a size bucket)."""
    from habu.plan.buckets import restricted

    out = dict(sizes or {})
    for e in restricted(model, plan.ranges).extents:
        if e.name not in out and e.name not in dict(plan.shape):
            out[e.name] = witness_size_for_runtime(e)
    return out


def witness_size_for_runtime(extent) -> int:
    """A size to run the finite-field check at for a runtime extent: a ragged one near the middle."""
    lo, hi, mult = extent.lo, extent.hi, extent.multiple
    target = min(hi, max(lo, 3 * 128 + 17))
    n = target - target % mult if mult > 1 else target
    return max(lo, n)


__all__ = ["Certificate", "Obligation", "Proof", "field_check_sizes", "prove", "verify_plan"]
