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

/** @brief ln 2 = 1 / log2(e): a base-2 maximum times LN2 is the maximum in the model's units (the row statistic a
 * training forward stores, habu/emit_cuda/attention_stats.py). */
constexpr float LN2 = 0.6931471805599453f;

/** @brief 2^x by the SFU (ex2.approx.ftz: 2^−∞ = 0). */
__device__ __forceinline__ float exp2_fast(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

/** @brief 2^x for x ≤ 0 on the FMA and integer pipes, not the SFU (FlashAttention-4's split of the exponentials,
 * for kernels whose softmax the SFU's 16 results a cycle an SM bound; the plan field `exp_fma`: on the H200 the
 * fused kernels ran 1-10% slower with it at every share, session 40, so it is a pin). x = n + f with n = round(x) by the
 * 1.5·2^23 addition (no conversion instruction: those share the SFU's pipe) and f in [−1/2, 1/2]; 2^f by a
 * degree-3 polynomial with constant term exactly 1 (relative error ≤ 1.1e-4 against 2^f: below P's bf16
 * rounding, 2^−9); n added to the result's exponent field. x is clamped at −127 first: −∞ (a masked score)
 * gives n = −127, f = 0, p = 1.0f, so the sum of exponent fields is exactly 0 (+0.0f, like 2^−∞ on the SFU);
 * x in (−127, −126) gives a denormal below 2^−126 (ex2.approx.ftz: 0). A NaN x gives 0 (fmaxf). */
__device__ __forceinline__ float exp2_fma(float x) {
  constexpr float ROUND = 12582912.0f;  // 1.5·2^23: x + ROUND holds round(x) in its low mantissa bits
  const float xc = fmaxf(x, -127.0f);
  const float t = __fadd_rn(xc, ROUND);
  const float f = __fsub_rn(xc, __fsub_rn(t, ROUND));  // x − round(x), exactly
  const float p = fmaf(fmaf(fmaf(0.05500858277f, f, 0.24221037328f), f, 0.69328290224f), f, 1.0f);
  // t's bits shifted by 23: round(x)·2^23 modulo 2^32 (t's exponent and the 1.5 shift out), added to p's exponent
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

/** @brief 2^x for score group `group` of a tile: on the FMA pipes (`exp2_fma`) for `Fma` groups of every 8, the
 * rest on the SFU (`exp2_fast`); a compile-time choice where `group` is an unrolled loop's counter. */
template <int Fma>
__device__ __forceinline__ float exp2_split(float x, int group) {
  return (group % 8 < Fma) ? exp2_fma(x) : exp2_fast(x);
}

/** @brief The shift the tile's exponentials use: the running maximum, or 0 while it is −∞ (no key seen). */
__device__ __forceinline__ float softmax_shift(float m) { return m == neg_inf_f() ? 0.0f : m; }

}  // namespace habu
