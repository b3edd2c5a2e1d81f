/** @brief TMA (sm_90+): tensor-map tile loads into shared memory completing on an mbarrier; gather4 on sm_100+. */
#pragma once
#include "../types.cuh"

namespace habu {

__device__ __forceinline__ void tma_prefetch_desc(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" :: "l"((u64)map) : "memory");
}
/** @brief Bring the box at (c0 innermost, c1) of a 2-D tensor map into the L2 (a hint: no value depends on it;
 *  the map's bounds clip the box as a load's do). A producer warms the plan's next kernel's first boxes
 *  (`warm_next`). */
__device__ __forceinline__ void tma_prefetch_2d(const TensorMap* map, int c0, int c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" :: "l"((u64)map), "r"(c0), "r"(c1)
               : "memory");
}
/** @brief Load the box at (c0 innermost, c1) of a 2-D tensor map; out-of-bounds elements read as zero. */
__device__ __forceinline__ void tma_load_2d(u32 dst, const TensorMap* map, u32 bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1) : "memory");
}
/** @brief Load the box at (c0 innermost, c1, c2) of a 3-D tensor map (a batched operand: c2 its batch, box 1
 *  along it); out-of-bounds elements read as zero. */
__device__ __forceinline__ void tma_load_3d(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
/** @brief Load the box at (c0 innermost, c1, c2, c3) of a 4-D tensor map (an operand of two batch indices). */
__device__ __forceinline__ void tma_load_4d(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
/** @brief Load the box at (c0 innermost, c1, c2, c3, c4) of a 5-D tensor map (an operand of three batch
 *  indices: attention's scores Q[b g r i e] · K[b g j e]); 5 is the most dimensions a tensor map has. */
__device__ __forceinline__ void tma_load_5d(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2, int c3,
                                            int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}
/** @brief An L2 cache policy that evicts the lines it covers last (`createpolicy.fractional`, all of them). */
__device__ __forceinline__ u64 l2_policy_evict_last() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
/** @brief An L2 cache policy that evicts the lines it covers first: bytes read once (a streamed weight). */
__device__ __forceinline__ u64 l2_policy_evict_first() {
  u64 policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}
/** @brief tma_load_2d with an L2 cache policy (l2_policy_evict_last, l2_policy_evict_first). A hint: the bytes
 *  that land are the same. `keep_operands` marks the loads of operands that many tiles re-read evict-last, so
 *  they stay in the L2 while an output larger than it streams through (H100, 2026-12-06: FFN-SKIP's 128-token
 *  weight gradients 47.8 → 41.7 and 49.1 → 42.6 µs); `stream_b` marks a streamed weight's loads evict-first and
 *  the other operand's evict-last (the same step 330 → 318 µs; docs/PERF.md, sessions 59 and 60). */
__device__ __forceinline__ void tma_load_2d_hinted(u32 dst, const TensorMap* map, u32 bar, int c0, int c1,
                                                   u64 policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4}], [%2], %5;\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "l"(policy) : "memory");
}
/** @brief tma_load_3d with an L2 cache policy (a batched operand; see tma_load_2d_hinted). */
__device__ __forceinline__ void tma_load_3d_hinted(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2,
                                                   u64 policy) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5}], [%2], %6;\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "l"(policy) : "memory");
}
/** @brief tma_load_4d with an L2 cache policy (see tma_load_2d_hinted). */
__device__ __forceinline__ void tma_load_4d_hinted(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2,
                                                   int c3, u64 policy) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6}], [%2], %7;\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "l"(policy) : "memory");
}
/** @brief tma_load_5d with an L2 cache policy (see tma_load_2d_hinted). */
__device__ __forceinline__ void tma_load_5d_hinted(u32 dst, const TensorMap* map, u32 bar, int c0, int c1, int c2,
                                                   int c3, int c4, u64 policy) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%3, %4, %5, %6, %7}], [%2], %8;\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "l"(policy) : "memory");
}
/** @brief Store the shared-memory box at src to (c0 innermost, c1) of a 2-D tensor map; the map's bounds clip
 *  what falls outside the tensor. Asynchronous: commit it to a bulk group and wait on the group before src is
 *  written again or the block exits. Writes made by threads are made visible to TMA first (fence_proxy_async). */
__device__ __forceinline__ void tma_store_2d(const TensorMap* map, u32 src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
               :: "l"((u64)map), "r"(src), "r"(c0), "r"(c1) : "memory");
}
/** @brief Store a box to (c0 innermost, c1, c2) of a 3-D tensor map (a batched output: c2 its batch). */
__device__ __forceinline__ void tma_store_3d(const TensorMap* map, u32 src, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {%2, %3, %4}], [%1];\n"
               :: "l"((u64)map), "r"(src), "r"(c0), "r"(c1), "r"(c2) : "memory");
}
/** @brief Store a box to (c0 innermost, c1, c2, c3) of a 4-D tensor map (an output of two batch indices). */
__device__ __forceinline__ void tma_store_4d(const TensorMap* map, u32 src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5}], [%1];\n"
               :: "l"((u64)map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
/** @brief Store a box to (c0 innermost, c1, c2, c3, c4) of a 5-D tensor map (an output of three batch indices). */
__device__ __forceinline__ void tma_store_5d(const TensorMap* map, u32 src, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];\n"
               :: "l"((u64)map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4) : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/** @brief Wait until at most N of this thread's bulk groups still read shared memory. */
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() { asm volatile("cp.async.bulk.wait_group.read %0;\n" :: "n"(N) : "memory"); }
/** @brief Wait until at most N of this thread's bulk groups are incomplete (their writes done). */
template <int N>
__device__ __forceinline__ void bulk_wait_group() { asm volatile("cp.async.bulk.wait_group %0;\n" :: "n"(N) : "memory"); }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
/** @brief Gather four rows (r0..r3) of a 2-D tensor map, each a box of the map's inner width at column c0. */
__device__ __forceinline__ void tma_gather4(u32 dst, const TensorMap* map, u32 bar, int c0, int r0, int r1, int r2, int r3) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cta.global.tile::gather4.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
      :: "r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
#endif

}  // namespace habu
