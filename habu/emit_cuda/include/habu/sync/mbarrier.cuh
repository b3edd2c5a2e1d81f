/** @brief mbarriers and proxy fences (sm_90): how TMA, cp.async and ordinary stores hand tiles to the tensor cores. */
#pragma once
#include "../types.cuh"

namespace habu {

__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(bytes));
}
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" :: "r"(bar), "r"(bytes));
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" :: "r"(bar));
}
/** @brief Spin until the barrier's phase with parity `phase` has completed. */
__device__ __forceinline__ void mbar_wait(u32 bar, u32 phase) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" :: "r"(bar), "r"(phase));
}
/** @brief Barrier over `count` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is __syncthreads). */
__device__ __forceinline__ void named_barrier_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
/** @brief Arrive at hardware barrier `id` of `count` threads without waiting: the threads that `named_barrier_sync`
 *  on it go on once `count` threads, these among them, have arrived (a warpgroup telling the next one to start). */
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" :: "r"(id), "r"(count) : "memory");
}
/** @brief Make this thread's ordinary shared-memory stores visible to the async proxy (TMA, wgmma). */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

/** @brief Advance a ring of `Stages` mbarrier-guarded stages by one k tile: the stage index wraps to 0 when it
 *  reaches `Stages` and the phase parity flips (xor `Flip`) with it. The emitter prints the template arguments
 *  from the lowering's `MbarrierRing.wrap` / `flip`, and habu/prove/pipeline.py runs `MbarrierRing.advance`,
 *  this function's transcription (habu/lower/pipeline.py). */
template <int Stages, u32 Flip = 1u>
__device__ __forceinline__ void ring_advance(int& stage, u32& phase) {
  if (++stage == Stages) { stage = 0; phase ^= Flip; }
}
/** @brief Initialise the `full` and `empty` mbarriers of a ring of `stages` stages, 16 bytes apart from `bars`
 *  (full at +0, empty at +8), with the arrival counts that complete their phases; one thread calls it. */
__device__ __forceinline__ void ring_init(u32 bars, int stages, u32 full_arrivals, u32 empty_arrivals) {
  for (int s = 0; s < stages; ++s) {
    mbar_init(bars + 16 * s, full_arrivals);
    mbar_init(bars + 16 * s + 8, empty_arrivals);
  }
  fence_barrier_init();
}
}  // namespace habu
