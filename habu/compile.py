"""`habu compile` and `habu verify`: choose (or read) a plan, prove it, write the plan and its report."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from habu.errors import HabuError, Span, UsageError
from habu.plan.buckets import BucketGrid, Ranges, cell_ranges, describe_ranges, restricted
from habu.plan.limits import check_nesting
from habu.plan.plan import Plan, field_docs
from habu.prove import Proof, prove
from habu.prove.limits import check_sizes
from habu.prove.rules import Obligation
from habu.search.space import default_plan
from habu.spec.ir import Model
from habu.spec.program import Program
from habu.target import Target
from habu.unguarded import needs_guard, unguarded_member


@dataclass
class Compiled:
    model: Model
    plans: list[Plan]  # the checked kernel set: guarded members first, the unguarded fallback last
    proofs: list[Proof]
    # a bucketed runtime extent (habu/plan/buckets.py): the grid, and the plans of each bucket in turn
    # (each plan's `ranges` name its bucket); None: one set for the declared ranges
    grid: BucketGrid | None = None


def bind_shape(model: Model, shape: dict[str, int]) -> Model:
    known = [e.name for e in model.extents]
    for name, n in shape.items():
        if name not in known:
            raise UsageError(f"{model.name} has no extent #{name} (its extents: "
                             f"{', '.join('#' + k for k in known)})")
        e = model.extent(name)
        if not e.is_static and not e.admits(n):
            raise UsageError(f"--shape {name}={n} is outside #{name}'s declared range ({e.describe()})")
    check_constant_indices(model, shape)
    return model.with_sizes(shape)


def check_constant_indices(model: Model, shape: dict[str, int]) -> None:
    """A constant index stays inside its extent at the given sizes (`habu check` proves it at the declared ones):
    S = X[3]·2 with --shape N=1 was refused as a plan breaking the bounds rule, with a hint to pin another data
    movement, where no plan can help."""
    from habu.spec.equation import format_expr
    from habu.spec.ir import IndexConst, loads

    tensors = {t.name: t for t in (*model.inputs, *model.outputs, *model.intermediates)}
    for eq in model.nodes:
        for ld in loads(eq.rhs):
            decl = tensors.get(ld.tensor)
            if decl is None:
                continue
            for ix, ext in zip(ld.indices, decl.extents, strict=False):
                if isinstance(ix, IndexConst) and ext in shape and ix.value >= shape[ext]:
                    raise UsageError(f"--shape {ext}={shape[ext]}: {model.name} reads {format_expr(ld)}, index {ix.value} of "
                                     f"#{ext}, which then has {shape[ext]} element(s)")


PIN_HINT = "choose another data movement with --pin, or a shape that satisfies the rule"


def plan_error(program: Program, model: Model, ob: Obligation, hint: str | None = PIN_HINT) -> HabuError:
    """A rule the plan breaks, as an error at the model. `hint`: what the caller can change (the
    commands with --pin suggest it; `habu verify` and the Python API pass their own, or None)."""
    span: Span | None = program.model_spans.get(model.name)
    cex = ""
    if ob.counterexample:
        runtime = {e.name for e in model.extents if not e.is_static}
        shown = {k: v for k, v in ob.counterexample.items() if k in runtime}
        if shown:
            cex = " (counterexample: " + ", ".join(f"{k}={v}" for k, v in sorted(shown.items())) + ")"
    return HabuError(f"the plan for {model.name} breaks rule {ob.rule.name} in {ob.kernel}: {ob.detail}{cex}",
                     span, (f"rule {ob.rule.name}: {ob.rule.summary} — {ob.rule.source}",
                            *([hint] if hint else [])))


def compile_model(program: Program, model_name: str, shape: dict[str, int], target: Target,
                  pins: dict[str, str], trials: int = 3, hint: str | None = PIN_HINT) -> Compiled:
    """The default (or pinned) plan, proven; `hint` is what a refusal suggests (see `plan_error`).
    A model with a bucketed runtime extent (habu/plan/buckets.py) gets one plan per size bucket, each
    made for its bucket's sizes and proven for them (its `ranges`), each with its guarded members."""
    model = bind_shape(program.model(model_name), shape)
    check_nesting(model, program.model_spans.get(model.name))
    check_sizes(model, model.sizes, target)  # before anything is proven or allocated
    try:
        grid = BucketGrid.of(model)
    except HabuError as err:  # no family for a node (found while looking for row widths): where the model is
        if err.span is not None:
            raise
        raise HabuError(err.message, program.model_spans.get(model.name), err.notes) from None
    if not grid.axes:
        plans, proofs = compile_set(program, model, (), shape, target, pins, trials, hint)
        return Compiled(model, plans, proofs)
    plans, proofs = [], []
    for cell in grid.cells():
        p, q = compile_set(program, model, cell_ranges(cell), shape, target, pins, trials, hint)
        plans += p
        proofs += q
    return Compiled(model, plans, proofs, grid)


def compile_set(program: Program, model: Model, ranges: Ranges, shape: dict[str, int], target: Target,
                 pins: dict[str, str], trials: int, hint: str | None) -> tuple[list[Plan], list[Proof]]:
    """The default plan for the sizes `ranges` allow (all: the declared ranges), proven; with its
    unguarded fallback when its rules hold only under guards."""
    bucket = f" for {describe_ranges(ranges)}" if ranges else ""
    try:
        plan = replace(default_plan(restricted(model, ranges), target, shape, pins), ranges=ranges)
    except HabuError as err:
        if err.span is not None:
            raise
        raise HabuError(err.message, program.model_spans.get(model.name), err.notes) from None
    proof = prove(model, plan, shape, trials=trials)
    if proof.violations:
        err = plan_error(program, model, proof.violations[0], hint)
        raise HabuError(err.message + bucket, err.span, err.notes) if bucket else err
    if proof.certificate is not None and not proof.certificate.passed:
        raise HabuError(f"the plan for {model.name}{bucket} computes something else: {proof.certificate.failure}",
                        program.model_spans.get(model.name))
    plans, proofs = [plan], [proof]
    if proof.guards:
        from habu.prove.trust import guard_texts

        plans[0] = replace(plan, guards=guard_texts(proof.obligations))
        # the same kernels, valid only where the guards hold: the check is the guarded plan's
        cert = proof.certificate.bound_to(plans[0]) if proof.certificate is not None else None
        proofs[0] = replace(proof, plan=plans[0], certificate=cert)
        fb, fb_proof = unguarded_member(model, plan, proof, ranges, shape, target, pins, trials)
        if needs_guard(fb_proof):
            bad = (fb_proof.violations or fb_proof.guards)[0] if (fb_proof.violations or fb_proof.guards) else None
            raise HabuError(f"no plan for {model.name} is valid for every size of its runtime extents{bucket}"
                            + (f": {bad.detail}" if bad else ""), program.model_spans.get(model.name))
        plans.append(fb)
        proofs.append(fb_proof)
    return plans, proofs


def kernel_set(compiled: Compiled, members: list):
    """The call-time kernel set of `compiled`'s plans, `members[i]` standing for plan i (an emitted
    plan): by bucket, a table lookup, where the model has bucketed extents; else guards alone."""
    from habu.emit_cuda.guards import KernelSet

    if compiled.grid is None:
        return KernelSet([(p.guards, m) for p, m in zip(compiled.plans, members, strict=True)])
    from habu.emit_cuda.buckets import BucketedKernelSet

    return BucketedKernelSet(compiled.grid, [(p.ranges, p.guards, m)
                                             for p, m in zip(compiled.plans, members, strict=True)])


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
    from habu.target import TARGETS

    if plan.target in TARGETS:
        check_sizes(model, model.sizes, TARGETS[plan.target])
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


def resource_report(built: list[dict], target: Target) -> str:
    out = ["", f"## Kernels ({target.name}, {built[0]['cubin'].compiler if built else ''})", "",
           "| plan | kernel | threads | dynamic smem | registers | spills | static smem | stack |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, b in enumerate(built):
        for k in b["kernels"]:
            r = b["resources"].get(k.name)
            if r is None:
                continue
            spill = f"**{r.spill_stores} B stored / {r.spill_loads} B loaded: this kernel spills**" if r.spills else "0"
            if r.wgmma_serialized:
                spill += " (**ptxas serialized its wgmma**)"
            out.append(f"| {i + 1} | `{k.name}` | {k.threads} | {k.smem} B | {r.registers} | {spill} | {r.smem} B | "
                       f"{r.stack} B |")
    return "\n".join(out) + "\n"


def report(model: Model, plans: list[Plan], proofs: list[Proof]) -> str:
    out = [f"# Compilation report: {model.name}", ""]
    out.append(f"model hash `{model.canonical_hash()}`")
    out.append("shape " + ", ".join(f"#{e.name} = {e.size}" if e.is_static else e.describe() for e in model.extents))
    if any(p.ranges for p in plans):  # one set of plans per size bucket (habu/plan/buckets.py)
        out += ["", "## Size buckets", "", "a call runs the plans of the bucket its sizes fall in", "",
                "| sizes | plans |", "| --- | --- |"]
        buckets: dict[tuple, list[int]] = {}
        for i, p in enumerate(plans):
            buckets.setdefault(p.ranges, []).append(i + 1)
        out += [f"| {describe_ranges(r)} | {', '.join(map(str, n))} |" for r, n in buckets.items()]
    for i, (plan, proof) in enumerate(zip(plans, proofs, strict=True)):
        out += ["", f"## Plan {i + 1} of {len(plans)} (`{plan.key}`)" + (
            f" — for {describe_ranges(plan.ranges)}" if plan.ranges else "") + (
            f" — valid where {' and '.join(plan.guards)}" if plan.guards else "")]
        out += ["", f"target {plan.target}", ""]
        from habu.plan.rewrite import apply_rewrites

        graph = apply_rewrites(model, plan.rewrites)
        if plan.rewrites:
            from habu.spec.equation import format_equation

            out += [f"rewrites {', '.join(plan.rewrites)}: the kernels compute the model as", ""]
            out += [f"    {format_equation(eq)}" for eq in graph.nodes] + [""]
        for j, k in enumerate(plan.kernels):
            out += [f"### kernel {j}: {k.kind} computing {', '.join(k.nodes)}", "", "| field | value | meaning |",
                    "| --- | --- | --- |"]
            for name, value, doc in field_docs(k):
                out.append(f"| {name} | {value if not isinstance(value, tuple) else ' '.join(value)} | {doc} |")
            out += ["", *_column_sum_note(graph, k, dict(plan.storage)), *_window_note(graph, k, dict(plan.shape))]
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


def cuda_source(proof: Proof, target: Target) -> tuple[str, list]:
    """One .cu with every kernel of a proven plan (staging passes included), and the kernels."""
    from habu.paths.emit import emit

    emitted = emit(proof, target)
    return "\n".join(k.source for k in emitted.kernels), list(emitted.kernels)


def build_kernels(model: Model, compiled: Compiled, target: Target) -> list[dict]:
    """Emit and compile every member: the source, the cubin and each kernel's resources."""
    from habu.emit_cuda.cache import compile_cached
    from habu.emit_cuda.nvrtc import resources_of

    out = []
    for plan, proof in zip(compiled.plans, compiled.proofs, strict=True):
        source, kernels = cuda_source(proof, target)
        cubin, _hit = compile_cached(source, f"habu_{model.name.lower()}", target.name)
        resources = {k.name: resources_of(cubin.log, k.name) for k in kernels}
        for k in kernels:
            k.check_registers(resources[k.name].registers)
        out.append({"plan": plan, "source": source, "cubin": cubin, "resources": resources, "kernels": kernels})
    return out


@dataclass(frozen=True)
class Measured:
    """What a search measured of the plan it reports: its time on the GPU, the roofline of the model at
    this shape, and the baseline timed in the same run (when the model has one)."""

    median_us: float
    p20_us: float | None
    p80_us: float | None
    roofline_us: float
    baseline: str | None = None
    baseline_us: float | None = None


def measured_report(m: Measured) -> str:
    """The report's "Measured" section."""
    p20 = f"{m.p20_us:.1f}" if m.p20_us is not None else "?"
    p80 = f"{m.p80_us:.1f}" if m.p80_us is not None else "?"
    text = (f"\n## Measured\n\nmedian {m.median_us:.1f} µs (p20 {p20}, p80 {p80}); "
            f"roofline {m.roofline_us:.1f} µs: {100 * m.roofline_us / m.median_us:.0f}% of it\n")
    if m.baseline_us:
        text += (f"\nbaseline {m.baseline}: {m.baseline_us:.1f} µs in the same run; the plan is "
                 f"{m.baseline_us / m.median_us:.2f}× its speed\n")
    return text


def write_outputs(out_dir: Path, model: Model, compiled: Compiled, target: Target | None = None,
                  measured: Measured | None = None) -> list[Path]:
    """plan.json, report.md and certificate.json; with a target also the .cu and its cubin; with a
    measurement (a search's winner) the report's "Measured" section. Each file is written once."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    built = build_kernels(model, compiled, target) if target is not None else []
    for i, plan in enumerate(compiled.plans):
        stem = "plan" if len(compiled.plans) == 1 else f"plan{i + 1}"
        p = out_dir / f"{stem}.json"
        p.write_text(plan.dumps() + "\n")
        written.append(p)
        if built and target is not None:
            cu = out_dir / f"{stem}.cu"
            cu.write_text(built[i]["source"])
            cb = out_dir / f"{stem}.{target.name}.cubin"
            cb.write_bytes(built[i]["cubin"].cubin)
            written += [cu, cb]
    rp = out_dir / "report.md"
    text = report(model, compiled.plans, compiled.proofs)
    if built and target is not None:
        text += resource_report(built, target)
    if measured is not None:
        text += measured_report(measured)
    rp.write_text(text)
    written.append(rp)
    cert = out_dir / "certificate.json"
    cert.write_text(json.dumps([pr.certificate.to_json() if pr.certificate else None for pr in compiled.proofs],
                               indent=2) + "\n")
    written.append(cert)
    return written


def _column_sum_note(graph: Model, kernel, storage: dict[str, str]) -> list[str]:
    """A line on a contraction kernel's column sum (habu/lower/column_epilogue.py), for the report; none elsewhere."""
    from habu.lower import lower
    from habu.plan.column_epilogue import kernel_chain

    if kernel.kind != "contraction":
        return []
    chain, columns = kernel_chain(graph, kernel.nodes)
    if not columns:
        return []
    cs = lower(graph, kernel, storage).column_sum  # type: ignore[attr-defined]
    summed = cs.summand.tensor if cs.summand is not None else chain[-1]
    how = (f"each block stores its tile row's sums in a workspace of ⌈#{cs.m.name}/{kernel.tile_m}⌉ × #{cs.n}, and "
           "the last block of each column tile to count itself adds them and stores"
           if cs.combine else "one tile row holds every row: the block stores its sums")
    return [f"Its epilogue also sums {summed} over #{cs.m.name} into {cs.out.tensor} ({', '.join(cs.nodes)}): {how}.",
            ""]


def _window_note(graph: Model, kernel, shape: dict[str, int]) -> list[str]:
    """A line on the k tiles a contraction kernel skips where the model makes them zero (habu/lower/k_bounds.py),
    for the report; none elsewhere."""
    from habu.lower import lower
    from habu.lower.window_share import window_share

    if kernel.kind != "contraction" or not kernel.skip_zero:
        return []
    lw = lower(graph, kernel)
    window = lw.window  # type: ignore[attr-defined]
    if not window:
        return []
    said = [f"{b.tensor} is zero outside {b.condition.describe()}" for b in window.operands]
    said += [f"its stored values are zero outside {t.condition.describe()}, whatever the product" for t in window.outputs]
    head = f"Its k loop skips the k tiles the model makes zero ({'; '.join(said)})"
    unfixed = [f"#{e.name}" for e in graph.runtime_extents if e.name not in shape]
    if unfixed:  # no size to count the tiles at (the share depends on the runtime extents)
        return [f"{head}: the share of the k steps its tiles run depends on {', '.join(unfixed)}.", ""]
    share = window_share(lw, {**graph.sizes, **shape})  # type: ignore[arg-type]
    return [f"{head}: its tiles run {100 * share:.0f}% of the k steps at this shape.", ""]
