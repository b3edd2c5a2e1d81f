"""The partitions of a model's nodes into kernels the families can compute (the search's fusion choices):
the greedy partition of `default_regions` first, then its regions cut at node boundaries."""

from __future__ import annotations

from itertools import combinations, pairwise

from habu.plan.conditions import has_condition
from habu.plan.patterns import Region, as_contraction, column_region, default_regions, row_local
from habu.spec.ir import Model, Reduce, walk


def piece_kind(model: Model, nodes: tuple[str, ...]) -> str:
    """The family of a piece cut from a region: a contraction's, the general family's where a node computes a
    condition on indices (the row and map families compute none: attention's dS cut from dP's epilogue went to
    the map family at 16 × 1k, whose field check refused the condition), else the row or the map family's."""
    eqs = [next(e for e in model.nodes if e.target == t) for t in nodes]
    if as_contraction(eqs[0]) is not None:
        return "contraction"
    if any(has_condition(e) for e in eqs):
        return "general"
    if any(any(isinstance(x, Reduce) for x in walk(e.rhs)) for e in eqs):
        return "rows"
    return "rows" if all(len(e.lhs) == 2 and row_local(e) for e in eqs) else "map"


def partitions(model: Model, limit: int = 64) -> list[tuple[Region, ...]]:
    """The partitions of the model's nodes into kernels that the families can compute: the greedy
    (most fused) partition first, then every way of cutting its regions at node boundaries, fewest
    cuts first. A cut stores the intermediate in global memory and launches one more kernel; it
    can still pay (a smaller epilogue keeps the contraction's registers free, a long row chain
    split into kernels that each fit in registers). Each partition appears once; at most `limit`."""
    greedy = default_regions(model)
    boundaries = [(ri, j) for ri, r in enumerate(greedy) for j in range(1, len(r.nodes))]
    out: list[tuple[Region, ...]] = []
    seen: set[tuple[Region, ...]] = set()
    for n_cuts in range(len(boundaries) + 1):
        for cuts in combinations(boundaries, n_cuts):
            regions: list[Region] = []
            for ri, r in enumerate(greedy):
                at = [0, *sorted(j for (rj, j) in cuts if rj == ri), len(r.nodes)]
                for lo, hi in pairwise(at):
                    piece = r.nodes[lo:hi]
                    reduces = any(isinstance(x, Reduce) for t in piece for x in walk(
                        next(e for e in model.nodes if e.target == t).rhs))
                    if r.kind == "columns" and reduces:  # its reduction, with what prologue and epilogue are left
                        kind = "columns" if column_region(model, piece) else "general"
                    else:
                        kind = r.kind if r.kind in ("general", "grouped") else piece_kind(model, piece)
                    regions.append(Region(kind, piece))
            p = tuple(regions)
            if p not in seen:
                seen.add(p)
                out.append(p)
            if len(out) >= limit:
                return out
    return out
