/** @brief A cluster split-K's reduction (sm_90+): the split blocks of one output tile, one thread-block
 *  cluster, each leave their f32 partial tile in shared memory; each block then adds up its share of the
 *  tile's elements from every block of the cluster (habu/lower/split_cluster.py). */
#pragma once
#include "../sync/cluster.cuh"

namespace habu {

/** @brief The two f32 words at the same shared-memory offset as `addr` (8-byte aligned) in block `cta` of
 *  the cluster (distributed shared memory); order it after the peer's stores with a cluster barrier. */
__device__ __forceinline__ float2 ld_shared_cluster_f32x2(u32 addr, u32 cta) {
  float2 v;
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %2, %3;\n"
      "ld.shared::cluster.v2.f32 {%0, %1}, [remote];\n"
      "}\n" : "=f"(v.x), "=f"(v.y) : "r"(addr), "r"(cta) : "memory");
  return v;
}

/** @brief The sum, in rank order, of the pair of partial words at `addr` over the `Blocks` blocks of this
 *  cluster. Call it after a cluster barrier that follows every block's partial stores, and keep every block
 *  in the kernel until a later cluster barrier (a peer may still be reading). */
template <int Blocks>
__device__ __forceinline__ float2 cluster_sum_f32x2(u32 addr) {
  float2 s = make_float2(0.0f, 0.0f);
#pragma unroll
  for (int r = 0; r < Blocks; ++r) {
    const float2 p = ld_shared_cluster_f32x2(addr, (u32)r);
    s.x += p.x;
    s.y += p.y;
  }
  return s;
}

}  // namespace habu
