"""The search's first plan: the one `habu compile` makes without a search (`default_plan`: the families' default
choices, such as the grouped family's wgmma loop and fused gate/up pair for an MoE layer, the cheaper scatters'
rewrites and the fused attention kernel where it is the default), with the fusion regions its kernels compute.

The search used to start from each region's analytic default alone (`default_kernels` over the greedy partition),
which is not what `habu compile` builds: on the derived Mixtral backward that was every expert product as a general
kernel, predicted 2.5·10^9 µs, and a 90-second search on the CPU stored a plan predicted at 792 ms where compile's
is predicted at 6.8 ms. Now a search is never seeded below the default a user gets without it; the other partitions
and each region's variants are tried from there as before."""

from __future__ import annotations

from dataclasses import dataclass

from habu.plan.patterns import Region
from habu.plan.plan import GroupedKernel, Kernel
from habu.plan.rewrite import apply_rewrites
from habu.search.cuts import default_partition
from habu.search.space import concrete_sizes, default_kernels, default_plan
from habu.spec.ir import Model
from habu.target import Target


@dataclass(frozen=True)
class Seed:
    rewrites: tuple[str, ...]  # the default plan's algebraic rewrites
    graph: Model  # the model after them: what its kernels compute
    regions: tuple[Region, ...]  # the fusion region of each kernel, in launch order
    kernels: tuple[Kernel, ...]


def aligned_regions(parts: tuple[Region, ...], kernels: tuple[Kernel, ...]) -> tuple[Region, ...] | None:
    """The region of each kernel: the greedy partition's, or where a kernel computes several consecutive regions'
    nodes (a grouped GEMM pair with the node of both), one region of them all; None where the kernels' nodes are
    not the partition's in order."""
    out: list[Region] = []
    at = 0
    for k in kernels:
        start, nodes = at, []
        while at < len(parts) and len(nodes) < len(k.nodes):
            nodes.extend(parts[at].nodes)
            at += 1
        if tuple(nodes) != tuple(k.nodes):
            return None
        if at - start == 1:
            out.append(parts[start])
        else:
            out.append(Region("grouped" if isinstance(k, GroupedKernel) else parts[start].kind, tuple(k.nodes)))
    return tuple(out) if at == len(parts) else None


def search_seed(model: Model, target: Target, sizes: dict[str, int]) -> Seed:
    """`habu compile`'s plan of `model` at `sizes` and its kernels' regions; where that plan cannot be made or its
    kernels are not regions of its partition, each region's analytic default over the greedy partition."""
    s = concrete_sizes(model, sizes)
    try:
        plan = default_plan(model, target, sizes)
    except Exception:  # (the regions' defaults below then say what is wrong)
        plan = None
    if plan is not None:
        graph = apply_rewrites(model, plan.rewrites)
        regions = aligned_regions(default_partition(graph, target, s), plan.kernels)
        if regions is not None:
            return Seed(plan.rewrites, graph, regions, plan.kernels)
    parts = default_partition(model, target, s)
    return Seed((), model, parts, default_kernels(model, target, s, parts))


__all__ = ["Seed", "aligned_regions", "search_seed"]
