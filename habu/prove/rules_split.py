"""The rules of a split-K contraction: no more splits than k tiles; an atomic split's epilogue linear into one f32
output; a cluster split's (habu/lower/split_cluster.py) blocks a hardware cluster whose rank is the split the
kernel reads, on a target with clusters."""

from __future__ import annotations

from collections.abc import Iterator

import z3

from habu.lower.contraction import ContractionLowering, epilogue_is_linear
from habu.prove.obligation import Context, Obligation, Rule

SPLIT_RULES = {r.name: r for r in (
    Rule("cluster-split-rank", "a cluster split's blocks share one tile, the split being the block's cluster rank",
         "CUDA guide: thread-block clusters (1-D clusters of consecutive blocks); PTX mapa"),
    Rule("split-k-tiles", "split-K divides the k tiles among at most as many splits as there are k tiles",
         "a split beyond the k tiles sums nothing: its blocks, partials and the field check's per-split work are "
         "waste (a hand-edited split_k of 4096 took the check over 4.5 GiB)"),
)}


def split_obligations(name: str, lw: ContractionLowering, ctx: Context, feature: Rule,
                      linear: Rule) -> Iterator[Obligation]:
    """A split-K kernel (split_k > 1): at most one split a k tile where #K is static (a runtime #K, the tokens of a
    weight gradient, may be short of the splits at some sizes: its empty splits add zeros, and the plan is not to
    be guarded off at those sizes for it); then the cluster split's rules, or the atomic split's (`linear`:
    partials added atomically need a linear epilogue into one f32 output)."""
    k, s = lw.kernel, ctx.ext
    k_tiles = lw.k_tiles(s)
    yield Obligation(SPLIT_RULES["split-k-tiles"], name, lw.out.tensor,
                     f"{k.split_k} splits ≤ the ⌈#{lw.k}/{lw.bk}⌉ k tiles",
                     k_tiles >= k.split_k if isinstance(s[lw.k], int) else True,
                     detail=f"split_k {k.split_k} but #{lw.k} = {s[lw.k]} holds {k_tiles} k tiles of {lw.bk}: "
                            "choose a split_k of at most the k tiles")
    if lw.cluster_split:
        yield from cluster_split_obligations(name, lw, ctx, feature)
        return
    also = f", and it stores {', '.join(a.tensor for _, a in lw.extra_outs)} too" if lw.extra_outs else ""
    yield Obligation(linear, name, lw.out.tensor, "split-K adds partials atomically: the epilogue "
                     "is linear and the output f32, the only one", epilogue_is_linear(lw) and lw.out.dtype == "f32"
                     and not lw.extra_outs, detail=f"output {lw.out.dtype}, epilogue "
                     f"{'linear' if epilogue_is_linear(lw) else 'nonlinear'}{also}")


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
