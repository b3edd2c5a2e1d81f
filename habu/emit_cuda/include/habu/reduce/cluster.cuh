/** @brief Reductions across the blocks of a thread-block cluster (sm_90+), for row kernels whose row
 *  is shared by a cluster of blocks. */
#pragma once
#include "../sync/cluster.cuh"
#include "../memory/async.cuh"

namespace habu {

/**
 * @brief The row's value of a reduction from the partials of the `Blocks` blocks of this cluster:
 * `word` is the shared-memory word where this block's `block_reduce` left its partial; after a cluster
 * barrier every block reads that word of every peer (distributed shared memory) in rank order, so
 * every block gets the same value. `init` is the reduction's identity. Every thread of every block of
 * the cluster must call it; no block may leave before a later cluster barrier (a peer may still read).
 */
template <bool IsMax, int Blocks>
__device__ __forceinline__ float cluster_combine(const float* word, float init) {
  cluster_sync();  // every block of the row's cluster has its partial in its scratch
  float w = init;
#pragma unroll
  for (int j = 0; j < Blocks; ++j) {
    const float v = ld_shared_cluster_f32(smem_addr(word), (u32)j);
    w = IsMax ? fmaxf(w, v) : w + v;
  }
  return w;
}

}  // namespace habu
