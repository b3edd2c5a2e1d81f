/** @brief Element types without CUDA's headers: 16-bit floats as raw bits, converted with PTX. */
#pragma once

namespace habu {

typedef unsigned short bf16;  // bfloat16 bits
typedef unsigned short f16;   // IEEE half bits
typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;

/** @brief The opaque 128-byte tensor map the host encodes with cuTensorMapEncodeTiled. */
struct alignas(64) TensorMap { u64 opaque[16]; };

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float bf16_to_float(bf16 x) { return __uint_as_float(((u32)x) << 16); }
__device__ __forceinline__ float f16_to_float(f16 x) {
  float f; asm("{ .reg .b16 h; mov.b16 h, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "h"(x)); return f;
}
__device__ __forceinline__ bf16 float_to_bf16(float x) {
  bf16 r; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r) : "f"(x)); return r;
}
__device__ __forceinline__ f16 float_to_f16(float x) {
  f16 r; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r) : "f"(x)); return r;
}
/** @brief Two floats to a packed pair of bf16 (low half = a). */
__device__ __forceinline__ u32 pack_bf16x2(float a, float b) {
  u32 r; asm("cvt.rn.bf16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(a), "f"(b)); return r;
}
__device__ __forceinline__ u32 pack_f16x2(float a, float b) {
  u32 r; asm("cvt.rn.f16x2.f32 %0, %2, %1;" : "=r"(r) : "f"(a), "f"(b)); return r;
}
/** @brief The first (low half) and second (high half) element of a packed pair, as floats: the inverse of
 *  pack_bf16x2 / pack_f16x2 for values of the type (exact). */
__device__ __forceinline__ float bf16x2_lo(u32 p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float bf16x2_hi(u32 p) { return __uint_as_float(p & 0xffff0000u); }
__device__ __forceinline__ float f16x2_lo(u32 p) { return f16_to_float((f16)(p & 0xffffu)); }
__device__ __forceinline__ float f16x2_hi(u32 p) { return f16_to_float((f16)(p >> 16)); }

}  // namespace habu
