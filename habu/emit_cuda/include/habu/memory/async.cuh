/** @brief cp.async (sm_80+): asynchronous global-to-shared copies of 4, 8 or 16 bytes, zero-filled when masked. */
#pragma once
#include "../types.cuh"

namespace habu {

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

/** @brief Copy `Bytes` (4, 8 or 16) to shared memory; when `pred` is false the destination is zeroed. */
template <int Bytes>
__device__ __forceinline__ void cp_async(u32 dst, const void* src, bool pred) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
  int src_size = pred ? Bytes : 0;
  if (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(dst), "l"(src), "r"(src_size));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" :: "r"(dst), "l"(src), "n"(Bytes), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
/** @brief Arrive on an mbarrier once this thread's earlier cp.async copies have landed. */
__device__ __forceinline__ void cp_async_arrive(u32 bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(bar));
}

}  // namespace habu
