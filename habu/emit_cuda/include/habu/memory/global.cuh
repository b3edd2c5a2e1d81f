/** @brief Global memory: loads of any element type as float, predicated vector loads, stores, atomics. */
#pragma once
#include "../types.cuh"

namespace habu {

__device__ __forceinline__ float load_f(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load_f(const double* p) { return (float)__ldg(p); }
__device__ __forceinline__ float load_bf16(const bf16* p) { return bf16_to_float(__ldg(p)); }
__device__ __forceinline__ float load_f16(const f16* p) { return f16_to_float(__ldg(p)); }

__device__ __forceinline__ void store_f(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_bf16(bf16* p, float v) { *p = float_to_bf16(v); }
__device__ __forceinline__ void store_f16(f16* p, float v) { *p = float_to_f16(v); }
__device__ __forceinline__ void atomic_add_f(float* p, float v) { atomicAdd(p, v); }
/** @brief Adds (v0, v1) into p[0], p[1] (p 8-byte aligned): one vector reduction on sm_90+ (an L2 sector op
 *  for both), two atomicAdds before. A scatter-add epilogue's adjacent column pair. */
__device__ __forceinline__ void atomic_add_f2(float* p, float v0, float v1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(v0), "f"(v1) : "memory");
#else
  atomicAdd(p, v0);
  atomicAdd(p + 1, v1);
#endif
}

/** @brief Bring the 128-byte line holding `p` into the L2 (`prefetch.global.L2`): a hint, no value depends on it.
 *  A wgmma producer warms the lines its tile's epilogue will read (`epilogue_prefetch`). */
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

/** @brief 16 bytes from global memory, or zeros when `pred` is false (no access is made then). */
__device__ __forceinline__ uint4 load16_or_zero(const void* p, bool pred) {
  uint4 r = make_uint4(0u, 0u, 0u, 0u);
  if (pred) r = __ldg(reinterpret_cast<const uint4*>(p));
  return r;
}
__device__ __forceinline__ uint2 load8_or_zero(const void* p, bool pred) {
  uint2 r = make_uint2(0u, 0u);
  if (pred) r = __ldg(reinterpret_cast<const uint2*>(p));
  return r;
}
__device__ __forceinline__ u32 load4_or_zero(const void* p, bool pred) {
  u32 r = 0u;
  if (pred) r = __ldg(reinterpret_cast<const u32*>(p));
  return r;
}
__device__ __forceinline__ unsigned short load2_or_zero(const void* p, bool pred) {
  unsigned short r = 0;
  if (pred) r = __ldg(reinterpret_cast<const unsigned short*>(p));
  return r;
}

/** @brief Two adjacent 16-bit elements p[0] and p[1] packed in one word (p[0] in the low half, `bf16x2_lo`): one
 *  4-byte load where `first` holds, zero where it does not; the second element kept where `second` holds, zero
 *  where it does not. p is 4-byte aligned, and p[1] is inside the tensor wherever p[0] is: an epilogue load of a
 *  tensor whose rows have an even static length (habu/lower/epilogue_pairs.py; the launch checks the base). */
__device__ __forceinline__ u32 load_pair16(const void* p, bool first, bool second) {
  const u32 r = first ? __ldg(reinterpret_cast<const u32*>(p)) : 0u;
  return second ? r : (r & 0xffffu);
}
/** @brief p[0] and p[1] (f32), as `load_pair16`: one 8-byte load where `first` holds (p 8-byte aligned), the
 *  second element zero where `second` does not hold. */
__device__ __forceinline__ float2 load_pair32(const float* p, bool first, bool second) {
  float2 r = first ? __ldg(reinterpret_cast<const float2*>(p)) : make_float2(0.0f, 0.0f);
  if (!second) r.y = 0.0f;
  return r;
}

}  // namespace habu
