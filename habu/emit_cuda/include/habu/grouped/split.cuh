/** @brief An f32 operand staged for bf16 mma.sync as two parts (habu/lower/grouped.py, `a_parts`). */
#pragma once
#include "../types.cuh"

namespace habu {

/** @brief Eight consecutive floats (x then y) as two 16-byte chunks of packed bf16 pairs: hi = bf16(a) and
 *  lo = bf16(a − hi). a − hi is exact in f32, so |a − hi − lo| ≤ 2^-17·|a| and hi·w + lo·w (w a bf16, each
 *  product exact in the f32 accumulator) carries a to 16 significant bits. A non-finite a keeps lo = 0
 *  (inf − inf would make it NaN). */
__device__ __forceinline__ void split_bf16x8(float4 x, float4 y, uint4& hi, uint4& lo) {
  const float v[8] = {x.x, x.y, x.z, x.w, y.x, y.y, y.z, y.w};
  u32 h[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const bf16 h0 = float_to_bf16(v[2 * i]), h1 = float_to_bf16(v[2 * i + 1]);
    float r0 = v[2 * i] - bf16_to_float(h0), r1 = v[2 * i + 1] - bf16_to_float(h1);
    if (r0 - r0 != 0.0f) r0 = 0.0f;  // inf or NaN
    if (r1 - r1 != 0.0f) r1 = 0.0f;
    h[i] = (u32)h0 | ((u32)h1 << 16);
    l[i] = pack_bf16x2(r0, r1);
  }
  hi = make_uint4(h[0], h[1], h[2], h[3]);
  lo = make_uint4(l[0], l[1], l[2], l[3]);
}

/** @brief The bf16 parts of eight floats (`split_bf16x8`) stored as one 16-byte chunk each at the shared-memory
 *  addresses `hi_at` and `lo_at` (the wgmma main loop's producer: A's hi and lo stage tiles). */
__device__ __forceinline__ void store_split_bf16x8(u32 hi_at, u32 lo_at, float4 x, float4 y) {
  uint4 hi, lo;
  split_bf16x8(x, y, hi, lo);
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" :: "r"(hi_at), "r"(hi.x), "r"(hi.y), "r"(hi.z), "r"(hi.w)
               : "memory");
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" :: "r"(lo_at), "r"(lo.x), "r"(lo.y), "r"(lo.z), "r"(lo.w)
               : "memory");
}

/** @brief Sixteen bytes from shared memory at `at` (16-byte aligned) as four floats. */
__device__ __forceinline__ float4 load_shared_f32x4(u32 at) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(at)
               : "memory");
  return v;
}

/** @brief The consumers' in-place pass over their slab of a staged A (the weight gradient's `wgrad_copy` staged,
 *  the grouped GEMM's `a_split` consumers): every thread of the warpgroup `id − 1` has read its chunks before any
 *  writes (an f32 chunk's parts land where other threads' raw floats were), and, after the writes and the
 *  generic-to-async proxy fence, every write is done before any of the warpgroup's wgmma reads the slab. `id` is a
 *  named barrier of the warpgroup's 128 threads. */
__device__ __forceinline__ void slab_pass_sync(int id) {
  asm volatile("bar.sync %0, 128;\n" :: "r"(id) : "memory");
}

}  // namespace habu
