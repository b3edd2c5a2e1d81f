/** @brief The fused attention kernel's wgmma main loop (habu/lower/attention_wgmma.py): register fences that pin
 * the order of the accumulator and operand registers around the asynchronous wgmma instructions. */
#pragma once
#include "../sync/mbarrier.cuh"
#include "../types.cuh"

namespace habu {

/** @brief An empty asm that reads and writes each register of `r`: placed after a wgmma wait (and before a wgmma
 * that reads or accumulates into `r`), the compiler cannot move the registers' other uses across it (CUTLASS's
 * warpgroup_fence_operand). */
template <int N>
__device__ __forceinline__ void fence_registers(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

/** @brief The same for packed operand registers (P's A fragments, 4 a k step). */
template <int N>
__device__ __forceinline__ void fence_registers(u32 (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}

/** @brief End ptxas's basic block here without changing a value: a warp-uniform branch on `x` being NaN whose
 * body only sleeps 0 ns. ptxas places a `wgmma.wait_group` at the top of its basic block (checked with
 * nvdisasm: the wait for P·V landed above the softmax's exponentials, so they never overlapped it); after
 * this branch the wait stays below the code before it, and the consumers keep setmaxnreg's registers
 * (a branch to a trap made ptxas keep the consumers within the launch's 168 and serialise the wgmmas). */
__device__ __forceinline__ void end_block(float x) {
  if (__any_sync(0xffffffffu, x != x)) asm volatile("nanosleep.u32 0;\n" ::: "memory");
}

/** @brief `x`, as a value the compiler cannot fold. A KV-tile count known at compile time (2 for a full
 * attention over 256 keys in 128-key tiles) lets nvcc peel the KV loop into straight code, in which ptxas then
 * keeps more values live and serializes every wgmma ("C7512: wgmma.mma_async instructions are serialized due to
 * insufficient register resources"; the H200, 2026-12-03: 80 µs where the loop's form ran 67). Through this the
 * loop is compiled as the loop it is, whatever the count. */
__device__ __forceinline__ long long unfolded(long long x) {
  asm volatile("mov.b64 %0, %0;\n" : "+l"(x));
  return x;
}

/** @brief Ping-pong between two consumer warpgroups (FA3): wait until named barrier `id` has the other
 * warpgroup's 128 arrivals (bar.sync counts this warpgroup's 128 threads with them). */
__device__ __forceinline__ void turn_wait(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
/** @brief Hand the turn to the other warpgroup: arrive (without waiting) on its named barrier `id`. */
__device__ __forceinline__ void turn_pass(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }

/** @brief One arrival of the calling warpgroup (its first thread's) on mbarrier `bar` where `when` holds: a consumer
 * warpgroup freeing what its wgmmas have read (the persistent kernel's Q, once the tile's last S is done). */
__device__ __forceinline__ void warpgroup_arrive_if(bool when, u32 bar, int tid) {
  if (when && tid % 128 == 0) mbar_arrive(bar);
}

}  // namespace habu
