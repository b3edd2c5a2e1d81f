"""The fused attention kernel's lowering from a model's softmax-weighted sum: its accesses, axes, mask and
accumulator layout (`AttentionLowering`, habu/lower/attention.py, holds what they mean)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from habu.lower.access import access_for
from habu.lower.attention import MMA_M, AttentionLowering
from habu.lower.fragments import ACCUMULATOR
from habu.plan.attention_fused import attention_statistics
from habu.plan.attention_split import attention_form
from habu.plan.plan import AttentionKernel
from habu.spec.ir import Gather, IndexConst, IndexVar, Model


def _axis_var(name: str, extent: str) -> IndexVar:
    return IndexVar(name, extent)


def lower_attention(model: Model, kernel: AttentionKernel, storage: Mapping[str, str] | None = None
                    ) -> AttentionLowering:
    statistics = attention_statistics(model, kernel.nodes)
    if len(kernel.nodes) != 1 and statistics is None:
        raise ValueError("an attention kernel computes one node, or one and its softmax's maximum and sum")
    form = attention_form(model, kernel.nodes[-1])
    if form is None:
        raise ValueError(f"{kernel.nodes[-1]} is not a softmax-weighted sum the attention kernel computes")
    names = {form.row: "i", form.key: "j", form.red: "e", form.col: "d"}
    batch_axes = tuple(f"x{n}" for n in range(len(form.batch)))
    names.update(zip(form.batch, batch_axes, strict=True))
    extent_of_axis = {a: v.extent for v, a in names.items()}
    q = access_for(model.tensor(form.q.tensor), form.q.indices, names, extent_of_axis, storage)
    k = access_for(model.tensor(form.k.tensor), form.k.indices, names, extent_of_axis, storage)
    v = access_for(model.tensor(form.v.tensor), form.v.indices, names, extent_of_axis, storage)
    out = access_for(model.tensor(form.node.target), form.node.lhs, names, extent_of_axis, storage)

    def rename(ix):
        if isinstance(ix, IndexVar):
            return _axis_var(names[ix], ix.extent)
        if isinstance(ix, Gather):
            return Gather(ix.tensor, tuple(rename(x) for x in ix.indices))
        assert isinstance(ix, IndexConst)
        return ix

    stats = None
    if statistics is not None:  # M[rows] and L[rows], rows = T's indices but the last (d)
        rows = form.node.lhs[:-1]
        stats = tuple(access_for(model.tensor(t), rows, names, extent_of_axis, storage)
                      for t in (statistics.maximum, statistics.total))
    mask = form.mask.map_indices(rename) if form.mask is not None else None
    ranges: list[str] = []
    if mask is not None:
        for side in (mask.left, mask.right):
            for _, ix in side.terms:
                r = model.tensor(ix.tensor).range if isinstance(ix, Gather) else None
                if r is not None and r not in ranges:
                    ranges.append(r)
    return AttentionLowering(kernel, form, q, k, v, out, batch_axes, tuple(b.extent for b in form.batch),
                             form.row.extent, form.key.extent, form.red.extent, form.col.extent, form.scale, mask,
                             kernel.index_width, model.sizes.get(form.red.extent), model.sizes.get(form.col.extent),
                             replace(ACCUMULATOR, group_warps=max(1, kernel.bm // (MMA_M * kernel.warp_m)) * kernel.kv_warps),
                             mask_ranges=tuple(ranges), stats=stats)  # type: ignore[arg-type]
