"""The default's fusion: the greedy regions (`default_regions`), each contraction region with a fused
epilogue cut after the contraction where the cost model predicts the two kernels faster than one.

A fused epilogue runs after each tile's main loop with the tensor cores idle: light ones (a bias, a
residual, a cast) cost less there than the pass over memory a cut adds, heavy ones do not (GELU's
derivative fused into the 4096-token FFN's `dT3 = dT6·W2ᵀ`: the product alone 627.1 µs, with the derivative
786.0 µs, the derivative as its own kernel moving 16-byte vectors 108.4 µs; H200, 2026-12-02, docs/PERF.md).
The cut's intermediate (the product) is stored in its storage type, as any stored intermediate is.
"""

from __future__ import annotations

from habu.lower import lower
from habu.paths import default_kernel
from habu.plan.partitions import piece_kind
from habu.plan.patterns import Region, default_regions
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


__all__ = ["cheaper_cut", "default_partition"]
