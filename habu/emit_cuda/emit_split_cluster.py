"""A cluster split's end of a tile in the wgmma kernel (habu/lower/split_cluster.py): the partial tile into
shared memory, the cluster barrier, each rank's share added up from every block (distributed shared
memory) through the fused epilogue, and the barrier that keeps the partials until the peers have read them."""

from __future__ import annotations

from habu.emit_cuda.cexpr import CExpr, c
from habu.emit_cuda.common import Signature
from habu.emit_cuda.emit_fma import epilogue_pair_code
from habu.lower.contraction import ContractionLowering
from habu.spec.ir import Model


def cluster_split_epilogue(lw: ContractionLowering, sig: Signature, model: Model, sizes, it: str, slabs: int,
                           consumers: int) -> str:
    """A cluster split's end of a tile (habu/lower/split_cluster.py): the consumers write their partial
    tile into shared memory over the ring's stages (`partial_word`), a cluster barrier, then each consumer
    thread adds up its pairs (`reduced_pair`; the second element the word after the first, `second`) from
    every block of the cluster, applies the epilogue and stores them; a second barrier keeps the partials
    until every peer has read them. The producer warpgroup meets both barriers after its loop."""
    frag, red = lw.fragment, lw.reduction
    assert red is not None
    row, col = CExpr(f"((cw * {slabs} + s) * 64 + {frag.row_in_warpgroup()})"), CExpr(f"({frag.col()})")
    if red.fragment_pairs:  # row-major partials: the fragment's column pair as one float2
        put = (f"*reinterpret_cast<float2*>(smem + {red.base} + 4 * ({c(red.partial_word(row, col))})) =\n"
               f"                make_float2(acc[s][{frag.register(0)}], acc[s][{frag.register(1)}]);")
    else:  # column-major partials (pairs along m): each element of the fragment's pair at its own word
        put = "\n            ".join(
            f"*reinterpret_cast<float*>(smem + {red.base} + 4 * ({c(red.partial_word(row, col + j))})) = "
            f"acc[s][{frag.register(j)}];" for j in (0, 1))
    r_row, r_col, q = red.reduced_pair(CExpr("rank"), CExpr("rt"), CExpr("i"))
    word = c(red.partial_word(CExpr("row"), CExpr("col")))
    epi = epilogue_pair_code(lw, sig, model, sizes, it, "m", "n", "sum.x", "sum.y")
    consumers_sync = (f"      habu::named_barrier_sync(15, {red.threads});  // every consumer's wgmma is done with the stages\n"
                      if consumers > 1 else "")
    return f"""{consumers_sync}#pragma unroll
      for (int s = 0; s < {slabs}; ++s)
#pragma unroll
        for (int j = 0; j < {lw.bn // 8}; ++j)
#pragma unroll
          for (int h = 0; h < {frag.halves}; ++h) {{  // this block's partial, over the ring's stages
            {put}
          }}
      habu::cluster_sync();  // every block of the tile's cluster has its partial in shared memory
      {{
        const long long rank = split;  // the split is the block's cluster rank (rule cluster-split-rank)
        const int rt = threadIdx.x - 128;  // the consumer thread
        float2 sums[{red.iterations}];  // every pair's loads first, so their latencies overlap
#pragma unroll
        for (int i = 0; i < {red.iterations}; ++i) {{
          const int q = {c(q)};
          if (q < {red.pairs}) {{
            const int row = (int)({c(r_row)});
            const int col = (int)({c(r_col)});
            sums[i] = habu::cluster_sum_f32x2<{red.split}>(smem_base + {red.base}u + 4u * (habu::u32)({word}));
          }}
        }}
#pragma unroll
        for (int i = 0; i < {red.iterations}; ++i) {{
          const int q = {c(q)};
          if (q < {red.pairs}) {{
            const {it} m = m0 + ({it})({c(r_row)});
            const {it} n = n0 + ({it})({c(r_col)});
            const float2 sum = sums[i];
            {epi}
          }}
        }}
      }}
      habu::cluster_sync();  // no block leaves while a peer may still read its partial
"""
