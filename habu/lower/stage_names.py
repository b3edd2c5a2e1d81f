"""One buffer per staged layout: a staging pass writes `@T`, the copy of tensor T its contraction reads. Two kernels
of a plan may stage the same tensor in two layouts (attention's backward stages K with its rows along j for the
scores and along e for dQ = Σ j dS·K): each layout needs a buffer of its own, or the later pass overwrites the
earlier copy with other extents (the runtime allocated one of the two sizes for both, the field check's memory one).
A later kernel's copy in another layout takes the suffix `_k<i>` (the kernel's place in the plan), `@K_k3`; the
same layout again keeps the same buffer (written twice with the same values, in the plan's order)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from habu.lower.contraction import ContractionLowering, with_kernel
from habu.lower.staging import StageLowering


def _layout(stage: StageLowering) -> tuple:
    return stage.dst.dtype, stage.dst.extents, stage.dst.positions


def with_stage_buffers_apart(kernels: Sequence[Any]) -> tuple[Any, ...]:
    """`kernels` (a plan's lowerings, in order) with each staged layout in a buffer of its own."""
    layouts: dict[str, tuple] = {}  # buffer -> the layout of the first pass writing it
    out: list[Any] = []
    for i, lw in enumerate(kernels):
        if isinstance(lw, ContractionLowering):
            suffix = f"_k{i}"
            while sides := _clashing_sides(lw, layouts):  # (a tensor of the model named like a suffixed copy: "_")
                renamed = tuple(suffix if side in sides else old for side, old in zip("ab", lw.stage_suffix,
                                                                                     strict=True))
                lw, suffix = with_kernel(replace(lw, stage_suffix=renamed), lw.kernel), suffix + "_"
            for s in lw.pre:
                layouts.setdefault(s.dst.tensor, _layout(s))
        out.append(lw)
    return tuple(out)


def _clashing_sides(lw: ContractionLowering, layouts: dict[str, tuple]) -> set[str]:
    """The operands ("a" for the pass of rows m, "b" for n's) whose staged buffer an earlier pass wrote in another
    layout."""
    return {"a" if s.row_axis == "m" else "b" for s in lw.pre if layouts.get(s.dst.tensor, _layout(s)) != _layout(s)}


__all__ = ["with_stage_buffers_apart"]
