/** @brief The grouped weight gradient's producer and epilogue (habu/lower/grouped_wgrad.py): chunks of eight
 *  elements of a row loaded from global memory (zeros where masked), stored into the MN-major stage tiles, and
 *  a block's tile added into the output it alone owns. */
#pragma once
#include "../types.cuh"
#include "split.cuh"

namespace habu {

/** @brief Eight consecutive floats at `p` as two float4 (x: the first four), or zeros where `ok` is false (no
 *  load is issued: a masked row past the group or the tensor). `p` is 16-byte aligned where `ok`. */
__device__ __forceinline__ void load_chunk(const float* p, bool ok, float4& x, float4& y) {
  x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  y = x;
  if (ok) {
    x = __ldg(reinterpret_cast<const float4*>(p));
    y = __ldg(reinterpret_cast<const float4*>(p) + 1);
  }
}

/** @brief Eight consecutive bf16 at `p` as one 16-byte word, or zeros where `ok` is false. */
__device__ __forceinline__ void load_chunk(const bf16* p, bool ok, uint4& v) {
  v = make_uint4(0u, 0u, 0u, 0u);
  if (ok) v = __ldg(reinterpret_cast<const uint4*>(p));
}

/** @brief The eight bf16 of a chunk times the row's factor, each product rounded to bf16 (nearest even): a bf16 A's
 *  row factor P[r], applied before the tile is stored (one bf16 rounding, as torch's bf16 autograd makes). */
__device__ __forceinline__ void scale_chunk(uint4& v, float s) {
  u32* w = reinterpret_cast<u32*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = pack_bf16x2(bf16_to_float((bf16)(w[i] & 0xffffu)) * s, bf16_to_float((bf16)(w[i] >> 16)) * s);
}

/** @brief The eight floats of a chunk times the row's factor (the row factor P[r], applied before the split). */
__device__ __forceinline__ void scale_chunk(float4& x, float4& y, float s) {
  x.x *= s; x.y *= s; x.z *= s; x.w *= s;
  y.x *= s; y.y *= s; y.z *= s; y.w *= s;
}

/** @brief Sixteen bytes into shared memory at `at` (a stage tile's chunk, 16-byte aligned). */
__device__ __forceinline__ void store_shared16(u32 at, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" :: "r"(at), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

/** @brief Eight bf16 (packed, one 16-byte word) from eight floats: the stage tile's chunk of a bf16 copy. */
__device__ __forceinline__ uint4 pack_bf16x8(float4 x, float4 y) {
  return make_uint4(pack_bf16x2(x.x, x.y), pack_bf16x2(x.z, x.w), pack_bf16x2(y.x, y.y), pack_bf16x2(y.z, y.w));
}

/** @brief Sixteen bytes from shared memory at `at` (16-byte aligned) as one word of eight bf16. */
__device__ __forceinline__ uint4 load_shared16(u32 at) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(at)
               : "memory");
  return v;
}

/** @brief A gather's index (4 or 8 bytes at `at`): the entry of the index ring the thread itself staged by cp.async
 *  (`cp_async<sizeof(T)>`, then `cp_async_wait` for its group), so no other thread's write is involved. */
template <typename T>
__device__ __forceinline__ T load_shared_index(u32 at) {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8, "cp.async stages indices of 4 or 8 bytes");
  if constexpr (sizeof(T) == 4) {
    u32 v;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(at) : "memory");
    return (T)v;
  } else {
    unsigned long long v;
    asm volatile("ld.shared.b64 %0, [%1];\n" : "=l"(v) : "r"(at) : "memory");
    return (T)v;
  }
}

/** @brief O[at], O[at + 1] of elements a block alone owns, for the epilogue's read-add-store: a batch of pairs is
 *  read first, every load in flight at once, then each is added and written (`write_owned`); one 8-byte access
 *  where `pair` (both inside and 8-byte aligned), else each element where its flag holds (zero where it does not). */
__device__ __forceinline__ float2 read_owned(const float* o, bool pair, bool in0, bool in1) {
  float2 v = make_float2(0.0f, 0.0f);
  if (pair) {
    v = *reinterpret_cast<const float2*>(o);
  } else {
    if (in0) v.x = o[0];
    if (in1) v.y = o[1];
  }
  return v;
}

/** @brief O[at], O[at + 1] = v where inside: the write half of the epilogue's read-add-store (see `read_owned`). */
__device__ __forceinline__ void write_owned(float* o, float2 v, bool pair, bool in0, bool in1) {
  if (pair) {
    *reinterpret_cast<float2*>(o) = v;
  } else {
    if (in0) o[0] = v.x;
    if (in1) o[1] = v.y;
  }
}

}  // namespace habu
