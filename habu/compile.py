"""`habu compile` and `habu verify`: choose (or read) a plan, prove it, write the plan and its report."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from habu.errors import HabuError, Span, UsageError
from habu.prove import Proof, prove
from habu.prove.rules import Obligation
from habu.search.plan import ContractionKernel, Plan, field_docs
from habu.search.space import default_plan
from habu.spec.ir import Model
from habu.spec.program import Program
from habu.target import Target


@dataclass
class Compiled:
    model: Model
    plans: list[Plan]  # the checked kernel set: guarded members first, the unguarded fallback last
    proofs: list[Proof]


def bind_shape(model: Model, shape: dict[str, int]) -> Model:
    for name, n in shape.items():
        e = model.extent(name)
        if not e.is_static and not e.admits(n):
            raise UsageError(f"--shape {name}={n} is outside #{name}'s declared range ({e.describe()})")
    return model.with_sizes(shape)


def plan_error(program: Program, model: Model, ob: Obligation) -> HabuError:
    span: Span | None = program.model_spans.get(model.name)
    cex = ""
    if ob.counterexample:
        runtime = {e.name for e in model.extents if not e.is_static}
        shown = {k: v for k, v in ob.counterexample.items() if k in runtime}
        if shown:
            cex = " (counterexample: " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) + ")"
    return HabuError(f"the plan for {model.name} breaks rule {ob.rule.name} in {ob.kernel}: {ob.detail}{cex}",
                     span, (f"rule {ob.rule.name}: {ob.rule.summary} — {ob.rule.source}",
                            "choose another data movement with --pin, or a shape that satisfies the rule"))


def fallback(plan: Plan, proof: Proof) -> Plan:
    """A member with no guard: every operand whose movement needed one is loaded with scalar ldg."""
    kernels = []
    for k in plan.kernels:
        if isinstance(k, ContractionKernel):
            bad = {o.tensor for o in proof.guards if o.kernel.startswith(f"kernel {plan.kernels.index(k)} ")}
            changes = {}
            if bad:
                changes = {"a_move": "ldg", "a_vector": 1, "b_move": "ldg", "b_vector": 1}
            kernels.append(replace(k, **changes))
        else:
            kernels.append(replace(k, vector=1) if hasattr(k, "vector") else k)
    return replace(plan, kernels=tuple(kernels), guards=())


def compile_model(program: Program, model_name: str, shape: dict[str, int], target: Target,
                  pins: dict[str, str], trials: int = 3) -> Compiled:
    model = bind_shape(program.model(model_name), shape)
    plan = default_plan(model, target, shape, pins)
    proof = prove(model, plan, shape, trials=trials)
    if proof.violations:
        raise plan_error(program, model, proof.violations[0])
    if proof.certificate is not None and not proof.certificate.passed:
        raise HabuError(f"the plan for {model.name} computes something else: {proof.certificate.failure}",
                        program.model_spans.get(model.name))
    plans, proofs = [plan], [proof]
    if proof.guards:
        import z3

        plans[0] = replace(plan, guards=tuple(str(z3.simplify(o.formula)) for o in proof.guards))
        proofs[0] = replace(proof, plan=plans[0])
        fb = fallback(plan, proof)
        fb_proof = prove(model, fb, shape, trials=trials)
        if fb_proof.violations or fb_proof.guards or not fb_proof.ok:
            bad = (fb_proof.violations or fb_proof.guards)[0] if (fb_proof.violations or fb_proof.guards) else None
            raise HabuError(f"no plan for {model.name} is valid for every size of its runtime extents"
                            + (f": {bad.detail}" if bad else ""), program.model_spans.get(model.name))
        plans.append(fb)
        proofs.append(fb_proof)
    return Compiled(model, plans, proofs)


def verify_file(program: Program, model_name: str, plan_path: Path, shape: dict[str, int],
                trials: int = 3) -> tuple[Model, Proof]:
    try:
        data = json.loads(plan_path.read_text())
    except FileNotFoundError:
        raise UsageError(f"no such plan file: {plan_path}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{plan_path} is not JSON: {exc.msg} at line {exc.lineno}") from None
    plan = Plan.from_json(data, str(plan_path))
    model = program.model(model_name)
    if plan.model_hash != model.canonical_hash():
        raise HabuError(f"{plan_path} was made for another computation (model hash {plan.model_hash[:12]}, "
                        f"{model.name} is {model.canonical_hash()[:12]})")
    sizes = dict(plan.shape) | shape
    model = bind_shape(model, sizes)
    known = {n for k in plan.kernels for n in k.nodes}
    missing = [eq.target for eq in model.nodes if eq.target not in known]
    if missing:
        raise HabuError(f"{plan_path}: no kernel computes {', '.join(missing)}")
    try:
        proof = prove(model, plan, sizes, trials=trials)
    except (KeyError, ValueError, StopIteration, NotImplementedError) as exc:
        raise HabuError(f"{plan_path}: the plan does not fit {model.name}: {exc}") from None
    return model, proof


# ----------------------------------------------------------------------------- the report


def report(model: Model, plans: list[Plan], proofs: list[Proof]) -> str:
    out = [f"# Compilation report: {model.name}", ""]
    out.append(f"model hash `{model.canonical_hash()}`")
    out.append("shape " + ", ".join(f"#{e.name} = {e.size}" if e.is_static else e.describe() for e in model.extents))
    for i, (plan, proof) in enumerate(zip(plans, proofs, strict=True)):
        out += ["", f"## Plan {i + 1} of {len(plans)} (`{plan.key}`)" + (
            f" — valid where {' and '.join(plan.guards)}" if plan.guards else "")]
        out += ["", f"target {plan.target}", ""]
        for j, k in enumerate(plan.kernels):
            out += [f"### kernel {j}: {k.kind} computing {', '.join(k.nodes)}", "", "| field | value | meaning |",
                    "| --- | --- | --- |"]
            for name, value, doc in field_docs(k):
                out.append(f"| {name} | {value if not isinstance(value, tuple) else ' '.join(value)} | {doc} |")
            out.append("")
        out += ["### obligations", "", "| rule | kernel | tensor | statement | status | how |", "| --- | --- | --- | --- | --- | --- |"]
        for ob in proof.obligations:
            out.append(f"| {ob.rule.name} | {ob.kernel} | {ob.tensor or ''} | {ob.statement} | {ob.status} | {ob.how} |")
        c = proof.certificate
        out += ["", "### finite-field certificate", ""]
        if c is None:
            out.append("not run: a rule failed")
        else:
            out.append(c.summary())
            out.append("")
            for k, v in c.blocks.items():
                out.append(f"- {k}: {v}")
            for n in c.notes:
                out.append(f"- {n}")
    return "\n".join(out) + "\n"


def write_outputs(out_dir: Path, model: Model, compiled: Compiled) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for i, plan in enumerate(compiled.plans):
        p = out_dir / ("plan.json" if len(compiled.plans) == 1 else f"plan{i + 1}.json")
        p.write_text(plan.dumps() + "\n")
        written.append(p)
    rp = out_dir / "report.md"
    rp.write_text(report(model, compiled.plans, compiled.proofs))
    written.append(rp)
    cert = out_dir / "certificate.json"
    cert.write_text(json.dumps([pr.certificate.to_json() if pr.certificate else None for pr in compiled.proofs],
                               indent=2) + "\n")
    written.append(cert)
    return written
