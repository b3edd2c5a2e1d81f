"""The rules of a cluster split-K (habu/lower/split_cluster.py): its blocks are a hardware cluster whose
rank is the split the kernel reads, on a target with clusters."""

from __future__ import annotations

from collections.abc import Iterator

import z3

from habu.lower.contraction import ContractionLowering
from habu.prove.obligation import Context, Obligation, Rule

SPLIT_RULES = {r.name: r for r in (
    Rule("cluster-split-rank", "a cluster split's blocks share one tile, the split being the block's cluster rank",
         "CUDA guide: thread-block clusters (1-D clusters of consecutive blocks); PTX mapa"),
)}


def cluster_split_obligations(name: str, lw: ContractionLowering, ctx: Context, feature: Rule) -> Iterator[Obligation]:
    """A cluster split (habu/lower/split_cluster.py): the hardware's cluster of block b is blocks
    b - b mod S .. (1-D clusters of S = split_k), and its rank b mod S; the kernel reads the partials of
    ranks 0..S-1 as the tile's splits 0..S-1. So the decode must give block b the split b mod S and the
    same tile as every block of its cluster, for every block of the grid at every size. `feature`: the
    rule that the target has the clusters."""
    k, t, s = lw.kernel, ctx.target, ctx.ext
    c = k.split_k
    yield Obligation(feature, name, lw.out.tensor,
                     f"thread-block clusters and distributed shared memory exist on {t.name}", t.clusters,
                     detail=f"{t.name} has no clusters")
    lin = z3.Int(f"{name}.block")
    first = lin - lin % c
    z, tm, tn, split = lw.decode(lin, s)
    z0, tm0, tn0, _ = lw.decode(first, s)
    same = [tm == tm0, tn == tn0, *(z[a] == z0[a] for a in z)]
    grid = lw.tiles(s)
    yield Obligation(SPLIT_RULES["cluster-split-rank"], name, lw.out.tensor,
                     f"block b computes split b mod {c} of the tile of its cluster's first block",
                     z3.Implies(z3.And(lin >= 0, lin < grid), z3.And(split == lin % c, *same)),
                     detail=f"the decode does not give a cluster of {c} consecutive blocks one tile, split by rank")
