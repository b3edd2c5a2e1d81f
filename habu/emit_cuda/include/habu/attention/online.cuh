/** @brief The online softmax of the fused attention kernels (habu/lower/attention.py), per accumulator row
 * in registers: the row reductions over the lanes of a row (xor shuffles) and the float guards the finite
 * field does not see (a row with no visible key yet has maximum −∞; its shift is 0, so exp(−∞ − 0) = 0). */
#pragma once
#include "../types.cuh"

namespace habu {

/** @brief −∞ as a float. */
__device__ __forceinline__ float neg_inf_f() { return -__int_as_float(0x7f800000); }

/** @brief The maximum of `x` over the lanes lane ^ offset for each offset of `Offsets...` (a row's lanes). */
template <int... Offsets>
__device__ __forceinline__ float row_max_lanes(float x) {
  ((x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, Offsets))), ...);
  return x;
}

/** @brief The sum of `x` over the lanes lane ^ offset for each offset of `Offsets...`. */
template <int... Offsets>
__device__ __forceinline__ float row_sum_lanes(float x) {
  ((x += __shfl_xor_sync(0xffffffffu, x, Offsets)), ...);
  return x;
}

/** @brief log2(e): the kernels keep scores in base 2 (x·log2 e, folded into the scale), so that exp(x) is
 * one ex2 instruction, 2^(x·log2 e). */
constexpr float LOG2E = 1.4426950408889634f;

/** @brief 2^x by the SFU (ex2.approx.ftz: 2^−∞ = 0). */
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/** @brief The shift the tile's exponentials use: the running maximum, or 0 while it is −∞ (no key seen). */
__device__ __forceinline__ float softmax_shift(float m) { return m == neg_inf_f() ? 0.0f : m; }

}  // namespace habu
