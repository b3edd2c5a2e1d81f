/** @brief TMA (sm_90+): tensor-map tile loads into shared memory completing on an mbarrier; gather4 on sm_100+. */
#pragma once
#include "../types.cuh"

namespace habu {

__device__ __forceinline__ void tma_prefetch_desc(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" :: "l"((u64)map) : "memory");
}
/** @brief Load the box at (c0 innermost, c1) of a 2-D tensor map; out-of-bounds elements read as zero. */
__device__ __forceinline__ void tma_load_2d(u32 dst, const TensorMap* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
/** @brief Gather four rows (r0..r3) of a 2-D tensor map, each a box of the map's inner width at column c0. */
__device__ __forceinline__ void tma_gather4(u32 dst, const TensorMap* map, u32 bar, int c0, int r0, int r1, int r2, int r3) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cta.global.tile::gather4.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
#endif

}  // namespace habu
