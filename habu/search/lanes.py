"""The search's two-lane twins (habu/plan/lanes.py): each finalist whose kernels can run side by side is timed
on two lanes too, and the faster one is stored first."""

from __future__ import annotations

from dataclasses import replace

from habu.plan.lanes import plan_accesses, side_by_side
from habu.plan.plan import Plan
from habu.spec.ir import Model


def lane_twins(model: Model, plans: list[Plan]) -> list[tuple[Plan, Plan]]:
    """(twin, plan): each one-lane plan whose kernels can run side by side, on two lanes (habu/plan/lanes.py): the
    same kernels, so the same proof; timed beside it, the faster one is kept. `model`: the rewritten model."""
    return [(replace(p, lanes=2), p) for p in plans
            if p.lanes == 1 and side_by_side(plan_accesses(model, p.kernels))]


def lane_certificate(certificate: dict, twin: Plan) -> dict:
    """A one-lane plan's certificate for its two-lane twin: the same kernels, the same check; the launch order is
    `lane_schedule`'s, checked by `schedule_faults` where a call is packed (habu/emit_cuda/call_plan.py)."""
    note = "two lanes: the finite-field check of the same kernels on one; the two-lane order checked at each build"
    return {**certificate, "plan_key": twin.key, "notes": [*certificate.get("notes", []), note]}


__all__ = ["lane_certificate", "lane_twins"]
