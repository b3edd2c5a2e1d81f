"""From a proven plan to CUDA: one kernel per fusion region, each printed from its lowering by its
kernel path (`path_for(kernel).emit`, habu/paths/).

`emit(proof)` is the way in for everything that runs a kernel (compile, build, the search): it takes
a `Proof` and prints from the lowering that proof's rules and finite-field check read. `emit_plan`
lowers and emits a plan that was not proven: for tests and tools that only look at the source."""

from __future__ import annotations

import re
from dataclasses import replace

from habu.emit_cuda.emit_stage import emit_stage
from habu.emit_cuda.kernel import CudaKernel, EmittedPlan
from habu.errors import HabuError
from habu.lower import ContractionLowering, LoweredPlan, lower_whole
from habu.lower.stores import stored_accesses
from habu.paths import path_for
from habu.plan.plan import Plan
from habu.prove import Proof
from habu.spec.ir import Model
from habu.target import Target


def kernel_name(model: Model, plan: Plan, i: int) -> str:
    base = "".join(ch if ch.isalnum() else "_" for ch in model.name.lower())
    return f"habu_{base}_{plan.key[:8]}_k{i}"


_KERNEL_INDEX = re.compile(r"^habu_\w+_k(\d+)(?:_stage\d+)?$")


def plan_kernel_index(name: str) -> int | None:
    """Which of the plan's kernels an entry function named by `kernel_name` computes (a staging
    kernel `<name>_stage<j>` counts for the kernel it feeds); None for any other name."""
    found = _KERNEL_INDEX.match(name)
    return int(found.group(1)) if found else None


def emit(proof: Proof, target: Target) -> EmittedPlan:
    """The CUDA of a proven plan, printed from the lowering its proof checked. A proof that failed,
    or that has no finite-field certificate, is refused."""
    if proof.lowered is None or proof.certificate is None or not proof.ok:
        why = (proof.violations[0].describe() if proof.violations else
               proof.certificate.failure if proof.certificate is not None and not proof.certificate.passed else
               "it was not checked over the finite field")
        raise HabuError(f"refusing to emit plan {proof.plan.key} of {proof.plan.model}: {why}")
    if proof.lowered.plan.kernels != proof.plan.kernels:
        raise HabuError(f"refusing to emit plan {proof.plan.key}: its kernels are not the ones proven")
    return emit_lowered(proof.lowered, proof.plan, target)


def emit_plan(model: Model, plan: Plan, target: Target) -> EmittedPlan:
    """The CUDA of a plan that has not been proven (tests, tools that read the source)."""
    return emit_lowered(lower_whole(model, plan), plan, target)


def emit_lowered(lowered: LoweredPlan, plan: Plan, target: Target) -> EmittedPlan:
    """One kernel per lowered kernel (after any staging passes), named by `plan` (a guarded member of
    a kernel set has its own key)."""
    lowerings = lowered.kernels
    model = lowered.model  # the nodes and intermediates the kernels compute
    static = {name: size for name, size in plan.shape}
    for e in model.extents:
        if e.is_static and e.name not in static:
            static[e.name] = e.size  # type: ignore[assignment]
    kernels: list[CudaKernel] = []
    staged: list[tuple[str, str, tuple[str, ...]]] = []
    written: set[str] = set()  # what the plan's earlier kernels write
    for i, lw in enumerate(lowerings):
        name = kernel_name(model, plan, i)
        early = False
        if isinstance(lw, ContractionLowering):
            for j, stage in enumerate(lw.pre):
                kernels.append(emit_stage(f"{name}_stage{j}", model, stage, lw.index_width, static))
                buffer = (stage.dst.tensor, stage.dst.dtype, stage.dst.extents)
                if any(b[0] == buffer[0] and b != buffer for b in staged):  # (habu/lower/stage_names.py)
                    raise ValueError(f"{name} stages {buffer[0]} as {buffer[1:]}, an earlier pass as another layout")
                if buffer not in staged:  # the same layout again: the same buffer, allocated once
                    staged.append(buffer)
                written.add(stage.dst.tensor)
            early = not (main_loop_reads(lw) & written)
        stores = tuple(dict.fromkeys(a.tensor for a in stored_accesses(lw)))  # R1 beside Y, S1 beside S3 too
        kernels.append(replace(path_for(lw.kernel).emit(name, model, lw, static, target, early), stores=stores))
        written.update(stores)
    storage = dict(plan.storage)
    inter = tuple((t.name, storage.get(t.name, "f32"), t.extents) for t in model.intermediates
                  if t.name in storage) + tuple(staged) + tuple(w for k in kernels for w in k.workspace)
    return EmittedPlan(tuple(kernels), inter, plan.lanes)


def main_loop_reads(lw: ContractionLowering) -> set[str]:
    """The tensors a contraction's main loop reads: its operands and the index tensors they gather by."""
    return {lw.a.tensor, lw.b.tensor} | {p.table for acc in (lw.a, lw.b) for p in acc.positions
                                         if p.kind == "gather"}
