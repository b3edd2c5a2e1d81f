/** @brief Row kernels' 16-byte chunks: the elements of a chunk, eight floats packed into one, and a
 *  predicated 16-byte store. Which chunk a thread visits and where it goes is the kernel's (printed from
 *  the lowering's thread map, habu/lower/lanes.py); these only move the bytes. */
#pragma once
#include "../types.cuh"

namespace habu {

/** @brief Element `q` of a 16-byte chunk of 16-bit (`T` = unsigned short) or 32-bit (`T` = float)
 *  elements; with `q` a constant of an unrolled loop and the chunk in registers, a register move. */
template <typename T>
__device__ __forceinline__ T chunk_element(const uint4& chunk, int q) {
  return reinterpret_cast<const T*>(&chunk)[q];
}

/** @brief Eight floats rounded to bf16 and packed into a 16-byte chunk (y[0] in the low half of .x). */
__device__ __forceinline__ uint4 pack_bf16x8(const float (&y)[8]) {
  uint4 r;
  r.x = pack_bf16x2(y[0], y[1]); r.y = pack_bf16x2(y[2], y[3]);
  r.z = pack_bf16x2(y[4], y[5]); r.w = pack_bf16x2(y[6], y[7]);
  return r;
}

/** @brief Eight floats rounded to f16 and packed into a 16-byte chunk (y[0] in the low half of .x). */
__device__ __forceinline__ uint4 pack_f16x8(const float (&y)[8]) {
  uint4 r;
  r.x = pack_f16x2(y[0], y[1]); r.y = pack_f16x2(y[2], y[3]);
  r.z = pack_f16x2(y[4], y[5]); r.w = pack_f16x2(y[6], y[7]);
  return r;
}

/** @brief Store 16 bytes to global memory at `p` (16-byte aligned) where `pred` holds; no access
 *  otherwise. The predicate is the store's mask, printed from the lowering's access. */
__device__ __forceinline__ void store16_if(void* p, uint4 v, bool pred) {
  if (pred) *reinterpret_cast<uint4*>(p) = v;
}

}  // namespace habu
