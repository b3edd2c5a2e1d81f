"""The one lowering: plans become loop bounds, masks, offsets and index widths.

The finite-field interpreter (`habu.prove.interp`), the rule checker (`habu.prove.rules`) and the
CUDA emitter (`habu.emit_cuda`) all read these objects, so what is proven is what runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from habu.lower.attention import AttentionLowering
from habu.lower.attention_lower import lower_attention
from habu.lower.attention_wgmma import lower_attention_wgmma
from habu.lower.columns import ColumnLowering, lower_columns
from habu.lower.contraction import ContractionLowering, lower_contraction
from habu.lower.general import GeneralLowering, lower_general
from habu.lower.grouped import GroupedLowering, lower_grouped
from habu.lower.grouped_wgrad import GroupedWgradLowering, lower_grouped_wgrad
from habu.lower.rows import MapLowering, RowLowering, lower_map, lower_rows
from habu.lower.stage_names import with_stage_buffers_apart
from habu.lower.warm_next import with_warm_next
from habu.plan.grouped_wgrad import as_grouped_wgrad
from habu.plan.plan import (
    AttentionKernel,
    ColumnKernel,
    ContractionKernel,
    GeneralKernel,
    GroupedKernel,
    Kernel,
    MapKernel,
    Plan,
    RowKernel,
)
from habu.spec.ir import Model

Lowering = (ContractionLowering | RowLowering | MapLowering | GeneralLowering | ColumnLowering | GroupedLowering
            | GroupedWgradLowering
            | AttentionLowering)


def lower(model: Model, kernel: Kernel, storage: Mapping[str, str] | None = None) -> Lowering:
    """Lower one kernel; `storage` gives the element type of intermediates (the plan's storage)."""
    if isinstance(kernel, ContractionKernel):
        return lower_contraction(model, kernel, storage)
    if isinstance(kernel, RowKernel):
        return lower_rows(model, kernel, storage)
    if isinstance(kernel, MapKernel):
        return lower_map(model, kernel, storage)
    if isinstance(kernel, GeneralKernel):
        return lower_general(model, kernel, storage)
    if isinstance(kernel, ColumnKernel):
        return lower_columns(model, kernel, storage)
    if isinstance(kernel, GroupedKernel):
        eq = next((e for e in model.nodes if e.target == kernel.nodes[0]), None)
        if len(kernel.nodes) == 1 and eq is not None and as_grouped_wgrad(model, eq) is not None:
            return lower_grouped_wgrad(model, kernel, eq, storage)  # the family's weight-gradient form
        return lower_grouped(model, kernel, storage)
    if isinstance(kernel, AttentionKernel):
        fa2 = lower_attention(model, kernel, storage)
        return lower_attention_wgmma(fa2) if kernel.main_loop == "wgmma" else fa2  # the Hopper main loop
    raise TypeError(kernel)


def lower_plan(model: Model, plan: Plan) -> list[Lowering]:
    """Lower every kernel of a plan of `model` (as written: the plan's rewrites are applied here)."""
    from habu.plan.rewrite import planned_model

    return list(_lower_kernels(planned_model(model, plan), plan))


@dataclass(frozen=True)
class LoweredPlan:
    """A plan lowered once, for everything downstream: the z3 rules and the finite-field check read
    these kernels, the proof keeps them, and the emitter prints the CUDA from the same objects."""

    source: Model  # the model as written (what the finite-field check's reference evaluates)
    model: Model  # the model as the plan computes it (its rewrites applied)
    plan: Plan
    kernels: tuple[Lowering, ...]


def lower_whole(model: Model, plan: Plan) -> LoweredPlan:
    """`plan` of `model` lowered, kernel by kernel, over the model its rewrites make."""
    from habu.plan.rewrite import planned_model

    graph = planned_model(model, plan)
    return LoweredPlan(model, graph, plan, _lower_kernels(graph, plan))


def _lower_kernels(model: Model, plan: Plan) -> tuple[Lowering, ...]:
    """The kernels of `plan` over `model` (its rewrites applied), staged layouts in buffers apart, each warming
    the next one's first boxes where it does."""
    storage = dict(plan.storage)
    kernels = with_stage_buffers_apart(tuple(lower(model, k, storage) for k in plan.kernels))
    return with_warm_next(kernels, _inputs(model))


def _inputs(model: Model) -> frozenset[str]:
    return frozenset(t.name for t in model.inputs)


__all__ = ["AttentionLowering", "ColumnLowering", "ContractionLowering", "GeneralLowering", "GroupedLowering", "GroupedWgradLowering", "LoweredPlan", "Lowering", "MapLowering", "RowLowering", "lower", "lower_plan",
           "lower_whole"]
