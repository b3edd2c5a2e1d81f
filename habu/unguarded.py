"""The unguarded member of a checked kernel set: a plan that holds for every size of the runtime extents, beside
the guarded default (habu/compile.py `compile_set`). Derived from the guarded plan kernel by kernel where it can be
(the field table's unguarded values, habu/plan/fields.py), else from the other contraction paths' defaults."""

from __future__ import annotations

from dataclasses import replace

from habu.errors import HabuError
from habu.plan.buckets import Ranges, restricted
from habu.plan.fields import unguarded_changes
from habu.plan.plan import ContractionKernel, Plan
from habu.prove import Proof, prove
from habu.search.space import default_plan
from habu.spec.ir import Model
from habu.target import Target


def fallback(plan: Plan, proof: Proof) -> Plan:
    """A member with no guard: each kernel a guard names takes every field's unguarded value (the
    field table's `unguarded`, habu/plan/fields.py: scalar ldg loads, vector 1);
    the other kernels hold for every size already and are kept. A staged operand stays staged: its pass
    copies the rows into a buffer of aligned rows at every size (only its vector falls back)."""
    guarded = _kernels_named(proof.guards)
    kernels = tuple(replace(k, **_unguarded(k)) if i in guarded else k for i, k in enumerate(plan.kernels))
    return replace(plan, kernels=kernels, guards=())


def _unguarded(kernel) -> dict:
    """The fields `kernel` changes in the unguarded member (`fallback`)."""
    changes = unguarded_changes(type(kernel))
    for side in ("a", "b"):
        if getattr(kernel, f"{side}_move", None) == "staged":
            changes.pop(f"{side}_move", None)
    return changes


def operand_fallback(model: Model, plan: Plan, proof: Proof) -> Plan | None:
    """`fallback` that resets a guarded contraction's movement and vector only on the operands its guards name (a
    guard on B's TMA rows leaves A's 16-byte cp.async as it was; one on what the kernel stores, neither: its store
    is `_direct_stores`'); a guard on another tensor (an index tensor) resets both, and other kernels as `fallback`
    does. None where a guarded kernel's product is not found."""
    from habu.paths.analytic import node_of
    from habu.plan.patterns import as_contraction
    from habu.plan.rewrite import planned_model

    graph = planned_model(model, plan)
    kernels = list(plan.kernels)
    for i in _kernels_named(proof.guards):
        k = kernels[i]
        changes = _unguarded(k)
        if isinstance(k, ContractionKernel):
            c = as_contraction(node_of(graph, k.nodes[0]))
            if c is None:
                return None
            c = c.swapped() if k.swap_ab else c
            named = {o.tensor.lstrip("@") for o in proof.guards if o.kernel.startswith(f"kernel {i} ")}
            named -= set(k.nodes)  # a guard on what the kernel stores (a TMA store's rows): `_direct_stores`'
            sides = {side for t in named for side, op in (("a", c.a), ("b", c.b))
                     if t == op.load.tensor or t == f"{op.load.tensor}_b"}
            if len(sides) < len(named):  # a guard on neither operand (an index tensor): both fall back
                sides = {"a", "b"}
            changes = {f: v for f, v in changes.items() if f[0] in sides}
        kernels[i] = replace(k, **changes)
    return replace(plan, kernels=tuple(kernels), guards=())


def unguarded_member(model: Model, plan: Plan, proof: Proof, ranges: Ranges, shape: dict[str, int], target: Target,
                     pins: dict[str, str], trials: int) -> tuple[Plan, Proof]:
    """The member of a guarded plan's kernel set that holds for every size: its kernels with every guarded field
    at its unguarded value (`fallback`). Where that plan breaks a rule (an A read m-major by wgmma needs TMA's
    16-byte rows), the default plans on the mma.sync and the SIMT contraction paths (unless the user pinned `mma`),
    unguarded the same way, give the kernels that do not hold: each from the first of them where the kernel of the
    same nodes holds (`_per_kernel`; the other kernels stay as they were), else one of those plans whole. The first
    whose proof holds unguarded, else the first tried."""
    first = _unguarded_plan(model, plan, proof, shape, trials)
    if not needs_guard(first[1]):
        return first
    direct = _direct_stores(first)  # a TMA store's rows need 16-byte strides: the failing kernels' stored from
    if direct is not None:          # their registers instead
        direct_proof = prove(model, direct, shape, trials=trials)
        if not needs_guard(direct_proof):
            return direct, direct_proof
    if "mma" in pins or not any(k.kind == "contraction" for k in plan.kernels):
        return first
    tried = []
    for mma in ("mma.sync", "fma"):
        try:
            alt = replace(default_plan(restricted(model, ranges), target, shape, {**pins, "mma": mma}), ranges=ranges)
        except HabuError:
            continue
        alt_proof = prove(model, alt, shape, trials=trials)
        if alt_proof.guards:  # (a kernel of it that breaks a rule may still be `_per_kernel`'s)
            alt, alt_proof = _unguarded_plan(model, alt, alt_proof, shape, trials)
        tried.append((alt, alt_proof))
    mixed = _per_kernel(first, tried)
    if mixed is not None:
        mixed_proof = prove(model, mixed, shape, trials=trials)
        if not needs_guard(mixed_proof):
            return mixed, mixed_proof
    return next(((alt, alt_proof) for alt, alt_proof in tried if not needs_guard(alt_proof)), first)


def _unguarded_plan(model: Model, plan: Plan, proof: Proof, shape: dict[str, int], trials: int) -> tuple[Plan, Proof]:
    """`operand_fallback` of a guarded plan where it holds for every size (or does with its failing kernels storing
    from registers), else `fallback`; each proven."""
    fb = fallback(plan, proof)
    finer = operand_fallback(model, plan, proof)
    if finer is not None and finer != fb:
        finer_proof = proof if finer.kernels == plan.kernels else prove(model, finer, shape, trials=trials)
        if not needs_guard(finer_proof):
            return finer, finer_proof
        direct = _direct_stores((finer, finer_proof))  # its operands as they were, stored from registers
        if direct is not None:
            direct_proof = prove(model, direct, shape, trials=trials)
            if not needs_guard(direct_proof):
                return direct, direct_proof
    return fb, prove(model, fb, shape, trials=trials)


def _direct_stores(first: tuple[Plan, Proof]) -> Plan | None:
    """`first`'s plan with each kernel its proof found failing that stores by TMA storing from its registers
    instead, or None where no such kernel stores by TMA."""
    plan, proof = first
    failing = _failing_kernels(proof)
    kernels = tuple(replace(k, store="direct") if i in failing and getattr(k, "store", None) == "tma" else k
                    for i, k in enumerate(plan.kernels))
    return replace(plan, kernels=kernels) if kernels != plan.kernels else None


def _failing_kernels(proof: Proof) -> set[int]:
    """The kernels (by index) a proof found a rule broken or guarded in."""
    return _kernels_named((*proof.violations, *proof.guards))


def _kernels_named(obligations) -> set[int]:
    """The kernels (by index) these obligations name ("kernel 2 (dW)")."""
    return {int(o.kernel.split()[1]) for o in obligations
            if o.kernel.startswith("kernel ") and o.kernel.split()[1].isdigit()}


def _per_kernel(first: tuple[Plan, Proof], tried: list[tuple[Plan, Proof]]) -> Plan | None:
    """`first`'s plan with each kernel that breaks a rule or needs a guard replaced by the kernel of the same nodes
    in the first of `tried` where that kernel holds; None where a kernel has no such replacement, or the plans
    differ in more than their kernels (rewrites, storage: the kernels would compute different models)."""
    plan, proof = first
    if proof.certificate is not None and not proof.certificate.passed:
        return None  # the check failed: no one kernel to blame
    kernels = list(plan.kernels)
    for i in sorted(_failing_kernels(proof)):
        found = None
        for alt, alt_proof in tried:
            if (alt.rewrites, alt.storage) != (plan.rewrites, plan.storage):
                continue
            bad = _failing_kernels(alt_proof)
            found = next((k for j, k in enumerate(alt.kernels) if k.nodes == kernels[i].nodes and j not in bad), None)
            if found is not None:
                break
        if found is None:
            return None
        kernels[i] = found
    return replace(plan, kernels=tuple(kernels))


def needs_guard(proof: Proof) -> bool:
    """Whether a plan does not hold unguarded for every size: a rule broken or guarded, or its check failed."""
    return bool(proof.violations or proof.guards or not proof.ok)


__all__ = ["fallback", "needs_guard", "operand_fallback", "unguarded_member"]
