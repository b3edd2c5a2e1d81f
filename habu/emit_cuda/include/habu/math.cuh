/** @brief The functions equations use, in float32: exp, erf, rsqrt, tanh, sigmoid, max/min, step. */
#pragma once

namespace habu {

__device__ __forceinline__ float f_exp(float x) { return __expf(x); }
__device__ __forceinline__ float f_log(float x) { return __logf(x); }
__device__ __forceinline__ float f_sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ float f_rsqrt(float x) { return rsqrtf(x); }
__device__ __forceinline__ float f_tanh(float x) { return tanhf(x); }
__device__ __forceinline__ float f_erf(float x) { return erff(x); }
/** @brief 1 / (1 + e^−x) by the fast reciprocal (__fdividef: MUFU.RCP, 2 ulp; 0 where e^−x overflows, the
 *  limit). IEEE division's exponent check and slow path, per element, took a third of the fused SwiGLU
 *  epilogue's instructions (ncu on the Mixtral gate/up kernel, 2026-12-03); __expf is already approximate. */
__device__ __forceinline__ float f_sigmoid(float x) { return __fdividef(1.0f, 1.0f + __expf(-x)); }
__device__ __forceinline__ float f_abs(float x) { return fabsf(x); }
__device__ __forceinline__ float f_max(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ float f_min(float a, float b) { return fminf(a, b); }
/** @brief a / b, and 0 where b = 0: the softmax of a fully masked row (its weights sum to 0) is 0. */
__device__ __forceinline__ float f_div0(float a, float b) { return b == 0.0f ? 0.0f : a / b; }
/** @brief 1 / b (IEEE), and 0 where b = 0: an equation's div0(a, b) prints as a · f_rcp0(b), so that a divisor
 *  shared by many elements (a softmax row's sum in a product's epilogue) is one reciprocal the compiler computes
 *  once, where each element's own IEEE division ran its exponent check and slow path (attention's backward: the
 *  scores' epilogue P = div0(where(…, exp(S − R1), 0), R2) took 118.6 µs of 16 × 1k on an H100, session 64). */
__device__ __forceinline__ float f_rcp0(float b) { return b == 0.0f ? 0.0f : 1.0f / b; }
__device__ __forceinline__ float f_step(float x) { return x > 0.0f ? 1.0f : 0.0f; }

/** @brief Warp-wide sum and max with shuffles. */
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace habu
