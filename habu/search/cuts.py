"""The default's fusion: the greedy regions (`default_regions`), each contraction region with a fused
epilogue cut after the contraction where the cost model predicts the two kernels faster than one.

A fused epilogue runs after each tile's main loop with the tensor cores idle: light ones (a bias, a
residual, a cast) cost less there than the pass over memory a cut adds, heavy ones do not (GELU's
derivative fused into the 4096-token FFN's `dT3 = dT6·W2ᵀ`: the product alone 627.1 µs, with the derivative
786.0 µs, the derivative as its own kernel moving 16-byte vectors 108.4 µs; H200, 2026-12-02, docs/PERF.md).
The cut's intermediate (the product) is stored in its storage type, as any stored intermediate is.
"""

from __future__ import annotations

from dataclasses import replace

from habu.lower import lower
from habu.lower.support import support_for
from habu.paths import default_kernel
from habu.plan.column_epilogue import fusable_columns, kernel_chain
from habu.plan.partitions import piece_kind
from habu.plan.patterns import Region, consumers, default_regions
from habu.plan.plan import ColumnKernel, ContractionKernel, Kernel
from habu.plan.storage import storage_dtypes
from habu.search.cost import kernel_cost
from habu.spec.ir import Model
from habu.target import Target


def default_partition(model: Model, target: Target, sizes: dict[str, int]) -> tuple[Region, ...]:
    """The default plan's regions: the greedy partition with each contraction region cut where cheaper."""
    storage = storage_dtypes(model)
    return tuple(piece for region in default_regions(model)
                 for piece in cheaper_cut(model, region, target, sizes, storage))


def cheaper_cut(model: Model, region: Region, target: Target, sizes: dict[str, int],
                storage: dict[str, str] | None = None) -> tuple[Region, ...]:
    """`region` as one kernel, or cut after its contraction node where the two kernels' predicted seconds
    are fewer (only a contraction region's epilogue chain is cut; other regions stay whole). `storage`: the
    intermediates' storage types (`storage_dtypes(model)` when not given)."""
    if region.kind != "contraction" or len(region.nodes) < 2:
        return (region,)
    head = Region("contraction", region.nodes[:1])
    tail = Region(piece_kind(model, region.nodes[1:]), region.nodes[1:])
    storage = storage if storage is not None else storage_dtypes(model)

    def seconds(regions: tuple[Region, ...]) -> float:
        total = 0.0
        for r in regions:
            kernel = default_kernel(model, r, target, sizes)
            total += kernel_cost(lower(model, kernel, storage), sizes, target).seconds
        return total

    try:
        cut = seconds((head, tail))
    except ValueError:  # a piece no path builds alone: the region stays whole
        return (region,)
    return (head, tail) if cut < seconds((region,)) else (region,)


def fuse_column_epilogues(model: Model, kernels: tuple[Kernel, ...], sizes: dict[str, int]) -> tuple[Kernel, ...]:
    """`kernels` with each column kernel that sums an earlier contraction kernel's result over its rows
    (`dB1[one h] = Σ b dT2[b h]`) computed in that kernel's epilogue instead (habu/plan/column_epilogue.py),
    where the contraction's tiles of m are one at every size of m (`sizes`: a runtime extent's upper bound),
    the result is stored anyway (a later kernel reads it, or the model outputs it) and the contraction's
    path prints the sum (`supported-path`). Not costed: the fused kernel drops a launch and a pass over the
    result for a few shuffles a tile."""
    out = list(kernels)
    storage = storage_dtypes(model)
    outputs = {t.name for t in model.outputs}
    for j, col in enumerate(kernels):
        if not isinstance(col, ColumnKernel):
            continue
        for i in range(j):
            k = out[i]
            if not isinstance(k, ContractionKernel) or kernel_chain(model, k.nodes)[1]:
                continue
            end = k.nodes[-1]
            if not fusable_columns(model, k.nodes, col.nodes):
                continue
            if end not in outputs and all(c.target in col.nodes for c in consumers(model, end)):
                continue  # the result is not stored otherwise: the fused kernel would store it for nothing
            fused = replace(k, nodes=(*k.nodes, *col.nodes))
            try:
                lw = lower(model, fused, storage)
            except ValueError:
                continue
            if lw.tiles_m(sizes) != 1 or support_for(fused).refusals(lw):  # type: ignore[attr-defined]
                continue
            out[i], out[j] = fused, None  # type: ignore[call-overload]
            break
    return tuple(k for k in out if k is not None)


__all__ = ["cheaper_cut", "default_partition", "fuse_column_epilogues"]
