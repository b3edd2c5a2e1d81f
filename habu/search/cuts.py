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
from habu.plan.column_epilogue import fusable_columns, kernel_chain, summed_tensor
from habu.plan.partitions import piece_kind
from habu.plan.patterns import Region, consumers, default_regions
from habu.plan.plan import ContractionKernel, Kernel
from habu.plan.storage import storage_dtypes
from habu.search.cost import kernel_cost
from habu.spec.ir import Model
from habu.target import Target


def default_partition(model: Model, target: Target, sizes: dict[str, int]) -> tuple[Region, ...]:
    """The default plan's regions: the greedy partition with each contraction region cut where cheaper."""
    storage = storage_dtypes(model)
    cut = tuple(piece for region in default_regions(model) for piece in cheaper_cut(model, region, target, sizes, storage))
    return fuse_column_regions(model, cut, target, sizes, storage)


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


def fuse_column_regions(model: Model, regions: tuple[Region, ...], target: Target, sizes: dict[str, int],
                        storage: dict[str, str] | None = None) -> tuple[Region, ...]:
    """`regions` with each column region that sums an earlier contraction region's result over its rows
    (`dB1[one h] = Σ b dT2[b h]`) joined to that region, its sum computed in the product's epilogue
    (habu/plan/column_epilogue.py), where the joined region's default kernel prints it (`supported-path`: the
    wgmma TMA-store epilogue; several tiles of m meet in the launch's workspace) and the result is stored anyway
    (a later kernel reads it, or the model outputs it). Not costed: the joined kernel drops a launch and a pass
    over the result for a few shuffles a tile (and, over several tiles of m, a store of its sums and a count)."""
    out: list[Region | None] = list(regions)
    storage = storage if storage is not None else storage_dtypes(model)
    for j, col in enumerate(regions):
        if col.kind != "columns":
            continue
        for i in range(j):
            head = out[i]
            if head is None or head.kind != "contraction" or not _joinable(model, head.nodes, col.nodes):
                continue
            joined = Region("contraction", (*head.nodes, *col.nodes))
            if column_sum_refused(model, default_kernel(model, joined, target, sizes), sizes, storage) is None:
                out[i], out[j] = joined, None
                break
    return tuple(r for r in out if r is not None)


def _joinable(model: Model, chain: tuple[str, ...], columns: tuple[str, ...]) -> bool:
    """The column nodes sum the chain's end (`fusable_columns`), the chain sums nothing yet, and its end is stored
    anyway (a later kernel reads it, or the model outputs it: it would not be stored for the sum alone)."""
    if kernel_chain(model, chain)[1] or not fusable_columns(model, chain, columns):
        return False
    end = chain[-1]
    if summed_tensor(model, chain, columns) != end:  # a tensor the epilogue reads: stored by its own kernel
        return True
    return end in {t.name for t in model.outputs} or any(c.target not in columns for c in consumers(model, end))


def column_sum_refused(model: Model, kernel: Kernel, sizes: dict[str, int], storage: dict[str, str]) -> str | None:
    """Why a contraction kernel cannot compute its column nodes in its epilogue at `sizes`, or None (also None for
    a kernel without them)."""
    if not isinstance(kernel, ContractionKernel) or not kernel_chain(model, kernel.nodes)[1]:
        return None
    try:
        lw = lower(model, kernel, storage)
    except ValueError as err:
        return str(err)
    refused = support_for(kernel).refusals(lw)  # type: ignore[arg-type]
    return "; ".join(refused) if refused else None


def fuse_column_kernels(model: Model, kernels: tuple[Kernel, ...], sizes: dict[str, int]) -> tuple[Kernel, ...]:
    """`kernels` with each column kernel that a pinned schedule now lets an earlier contraction kernel sum in its
    epilogue joined to it (`fuse_column_regions` decides at the default schedules; a pinned tile may hold every
    row where the default's did not)."""
    storage = storage_dtypes(model)
    out: list[Kernel | None] = list(kernels)
    for j, col in enumerate(kernels):
        if col.kind != "columns":
            continue
        for i in range(j):
            k = out[i]
            if not isinstance(k, ContractionKernel) or not _joinable(model, k.nodes, col.nodes):
                continue
            joined = replace(k, nodes=(*k.nodes, *col.nodes))
            if column_sum_refused(model, joined, sizes, storage) is None:
                out[i], out[j] = joined, None
                break
    return tuple(k for k in out if k is not None)


def split_refused_columns(model: Model, kernels: tuple[Kernel, ...], target: Target, sizes: dict[str, int]
                          ) -> tuple[Kernel, ...]:
    """`kernels` with each contraction kernel whose column sum its schedule cannot print (a pinned instruction or
    tile) split back into the product and the column family's kernel after it."""
    storage = storage_dtypes(model)
    out: list[Kernel] = []
    for k in kernels:
        if column_sum_refused(model, k, sizes, storage) is None:
            out.append(k)
            continue
        chain, columns = kernel_chain(model, k.nodes)
        out += [replace(k, nodes=chain), default_kernel(model, Region("columns", columns), target, sizes)]
    return tuple(out)


__all__ = ["cheaper_cut", "default_partition", "fuse_column_kernels", "fuse_column_regions", "split_refused_columns"]
