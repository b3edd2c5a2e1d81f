"""Trusting a plan that was stored: certificates bound to what they prove, guards that are the ones
the rules produce, and a re-proof before a stored plan is used.

A certificate records the plan's key (`Plan.key`: its JSON, hashed — the kernels, shape and guards),
the model's canonical hash and the Habu version that made it. Presented with another plan, model or
version it proves nothing about them, and is refused. A plan's `guards` must be exactly the guarded
obligations its rules produce: a member of a checked kernel set with its guards deleted or edited
would run where its proof does not hold.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from habu.errors import HabuError
from habu.plan.plan import Plan
from habu.prove import Proof, prove
from habu.prove.rules import Obligation
from habu.spec.ir import Model
from habu.version import __version__

BINDING_FIELDS = ("plan_key", "model_hash", "habu_version")


class PlanRefused(HabuError):
    """A stored or hand-edited plan that fails its re-proof, or a certificate that is not its own."""


def binding(plan: Plan, model: Model) -> dict[str, str]:
    """What a certificate for `plan` of `model`, made by this Habu, is bound to."""
    return {"plan_key": plan.key, "model_hash": model.canonical_hash(), "habu_version": __version__}


def check_certificate(cert: Mapping[str, Any], plan: Plan, model: Model, version: str = __version__) -> None:
    """Refuse a certificate made for another plan, model or Habu version (or bound to nothing).
    `version`: the Habu version the plan is presented as made by (a database key's)."""
    if not isinstance(cert, Mapping):
        raise PlanRefused(f"the certificate of plan {plan.key} is not a certificate (a {type(cert).__name__})")
    wanted = binding(plan, model) | {"habu_version": version}
    if cert.get("passed") is not True:
        raise PlanRefused(f"the certificate of plan {plan.key} records a failed or unfinished check")
    for name in BINDING_FIELDS:
        got = cert.get(name)
        if got is None:
            raise PlanRefused(f"the certificate of plan {plan.key} is bound to no {name.replace('_', ' ')}: "
                              "it could be any plan's (prove the plan again)")
        if got != wanted[name]:
            raise PlanRefused(f"the certificate presented with plan {plan.key} was made for {name.replace('_', ' ')} "
                              f"{str(got)[:16]}, not {wanted[name][:16]}: it proves nothing about this plan")


def guard_texts(obligations: list[Obligation]) -> tuple[str, ...]:
    """The guards of a checked kernel-set member: each guarded obligation's formula, as z3 prints it."""
    import z3

    return tuple(str(z3.simplify(o.formula)) for o in obligations if o.status == "guarded")


GuardHolds = Callable[[str], bool]


def guard_mismatch(plan: Plan, proof: Proof, holds: GuardHolds | None = None) -> str | None:
    """Why the plan's declared guards are not the ones its rules produce, or None when they are.
    `holds`: whether a guard holds at the sizes the plan was proven at; a declared guard that no
    rule produces is accepted when it does (proven at a fixed shape, a guarded obligation is proved
    outright, and the plan's guard is then merely true)."""
    wanted = set(guard_texts(proof.obligations))
    declared = set(plan.guards)
    if wanted == declared:
        return None
    missing = sorted(wanted - declared)
    extra = sorted(g for g in declared - wanted if holds is None or not holds(g))
    if not missing and not extra:
        return None
    parts = []
    if missing:
        kernels = sorted({o.kernel for o in proof.guards if guard_texts([o])[0] in missing})
        parts.append(f"its rules hold in {', '.join(kernels)} only where {' and '.join(missing)}, "
                     "which its guards do not say")
    if extra:
        parts.append(f"it declares guards no rule produces: {' and '.join(extra)}")
    return f"plan {plan.key}'s guards are not the ones its rules produce: " + "; ".join(parts)


def refusal(plan: Plan, model: Model, ob: Obligation) -> PlanRefused:
    cex = ""
    if ob.counterexample:
        cex = " (counterexample: " + ", ".join(f"{k}={v}" for k, v in sorted(ob.counterexample.items())) + ")"
    return PlanRefused(f"plan {plan.key} for {model.name} breaks rule {ob.rule.name} in {ob.kernel}: "
                       f"{ob.detail or ob.statement}{cex}",
                       notes=(f"rule {ob.rule.name}: {ob.rule.summary} — {ob.rule.source}",))


def check_proof(plan: Plan, model: Model, proof: Proof, holds: GuardHolds | None = None) -> None:
    """Refuse a plan whose proof failed: a broken rule, guards that differ, a failed field check."""
    if proof.violations:
        raise refusal(plan, model, proof.violations[0])
    wrong_guards = guard_mismatch(plan, proof, holds)
    if wrong_guards:
        raise PlanRefused(wrong_guards)
    c = proof.certificate
    if c is None or not c.passed:
        raise PlanRefused(f"plan {plan.key} does not compute {model.name}: "
                          f"{c.failure if c is not None else 'the finite-field check did not run'}")


# re-proofs of stored plans in this process: (plan key, model hash, sizes, version) -> the proof
_REPROVEN: dict[tuple[str, str, tuple[tuple[str, int], ...], str], Proof] = {}


def reprove(model: Model, plan: Plan, sizes: Mapping[str, int] | None = None, trials: int = 1,
            holds: GuardHolds | None = None) -> Proof:
    """Prove a stored plan again before it is used (the rules and a `trials`-trial finite-field
    check), refusing it with a `PlanRefused` that names the rule and the kernel when it fails.
    A plan that passed is not proven twice in one process (the answer is kept by plan key, model
    hash, sizes and Habu version)."""
    if plan.model_hash != model.canonical_hash():
        raise PlanRefused(f"plan {plan.key} was made for another computation (model hash {plan.model_hash[:12]}, "
                          f"{model.name} is {model.canonical_hash()[:12]})")
    key = (plan.key, model.canonical_hash(), tuple(sorted((sizes or {}).items())), __version__)
    known = _REPROVEN.get(key)
    if known is not None:
        return known
    try:
        proof = prove(model, plan, sizes, trials=trials)
    except (KeyError, ValueError, StopIteration, NotImplementedError) as exc:
        raise PlanRefused(f"plan {plan.key} does not fit {model.name}: {exc}") from None
    check_proof(plan, model, proof, holds)
    _REPROVEN[key] = proof
    return proof


__all__ = ["PlanRefused", "binding", "check_certificate", "check_proof", "guard_mismatch", "guard_texts",
           "reprove"]
