/** @brief Column reductions (`G[n] = Σ r dY[r n]`): packed loads of adjacent columns, their elements as
 * floats, f32 accumulation (the store, direct or atomic, is memory/global.cuh's).
 * Every index is the lowering's (habu/lower/columns.py), printed by habu/emit_cuda/emit_columns.py. */
#pragma once
#include "../types.cuh"
#include "../memory/global.cuh"

namespace habu {

/** @brief A packed vector of `Bytes` bytes (4, 8 or 16): the register type one load fills. */
template <int Bytes> struct packed;
template <> struct packed<4> { typedef u32 type; };
template <> struct packed<8> { typedef uint2 type; };
template <> struct packed<16> { typedef uint4 type; };

/** @brief `Bytes` bytes from global memory at `p` (aligned to `Bytes`), or zeros when `pred` is false
 * (no access is made then). */
template <int Bytes>
__device__ __forceinline__ typename packed<Bytes>::type load_packed(const void* p, bool pred);
template <> __device__ __forceinline__ u32 load_packed<4>(const void* p, bool pred) { return load4_or_zero(p, pred); }
template <> __device__ __forceinline__ uint2 load_packed<8>(const void* p, bool pred) { return load8_or_zero(p, pred); }
template <> __device__ __forceinline__ uint4 load_packed<16>(const void* p, bool pred) { return load16_or_zero(p, pred); }

/** @brief Element `i` (a compile-time index after unrolling) of a packed vector of bf16, as float. */
template <typename Raw>
__device__ __forceinline__ float packed_bf16(const Raw& raw, int i) {
  return bf16_to_float(reinterpret_cast<const bf16*>(&raw)[i]);
}

/** @brief Element `i` of a packed vector of f16, as float. */
template <typename Raw>
__device__ __forceinline__ float packed_f16(const Raw& raw, int i) {
  return f16_to_float(reinterpret_cast<const f16*>(&raw)[i]);
}

/** @brief Element `i` of a packed vector of f32. */
template <typename Raw>
__device__ __forceinline__ float packed_f32(const Raw& raw, int i) {
  return reinterpret_cast<const float*>(&raw)[i];
}

/** @brief Fold `value` into the running reduction `acc`: a sum, or a max. */
template <bool IsMax>
__device__ __forceinline__ void accumulate(float& acc, float value) {
  acc = IsMax ? fmaxf(acc, value) : acc + value;
}

}  // namespace habu
