/** @brief Vectors of N consecutive elements in global memory, as floats: one load, store or reduction of
 *  N·sizeof(element) bytes (at most 16) from an address aligned to that size. A general kernel's thread
 *  moves its `vector` elements with these (habu/lower/general.py `vector_accesses`). */
#pragma once
#include "../types.cuh"

namespace habu {

/** @brief p[0..N) as floats into r, or zeros when `pred` is false (no access is made then); f32, N 1, 2 or 4. */
template <int N>
__device__ __forceinline__ void load_vec(const float* p, float (&r)[N], bool pred) {
  static_assert(N == 1 || N == 2 || N == 4, "f32 vectors of 1, 2 or 4 elements");
#pragma unroll
  for (int j = 0; j < N; ++j) r[j] = 0.0f;
  if (!pred) return;
  if constexpr (N == 4) {
    const float4 x = __ldg(reinterpret_cast<const float4*>(p));
    r[0] = x.x; r[1] = x.y; r[2] = x.z; r[3] = x.w;
  } else if constexpr (N == 2) {
    const float2 x = __ldg(reinterpret_cast<const float2*>(p));
    r[0] = x.x; r[1] = x.y;
  } else {
    r[0] = __ldg(p);
  }
}

/** @brief p[0..N) of bf16 as floats into r, or zeros when `pred` is false; N 1, 2, 4 or 8 (2..16 bytes). */
template <int N>
__device__ __forceinline__ void load_vec(const bf16* p, float (&r)[N], bool pred) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "bf16 vectors of 1, 2, 4 or 8 elements");
  u32 w[(N + 1) / 2];
#pragma unroll
  for (int i = 0; i < (N + 1) / 2; ++i) w[i] = 0u;
  if (pred) {
    if constexpr (N == 8) {
      const uint4 x = __ldg(reinterpret_cast<const uint4*>(p));
      w[0] = x.x; w[1] = x.y; w[2] = x.z; w[3] = x.w;
    } else if constexpr (N == 4) {
      const uint2 x = __ldg(reinterpret_cast<const uint2*>(p));
      w[0] = x.x; w[1] = x.y;
    } else if constexpr (N == 2) {
      w[0] = __ldg(reinterpret_cast<const u32*>(p));
    } else {
      w[0] = __ldg(p);
    }
  }
#pragma unroll
  for (int j = 0; j < N; ++j) r[j] = __uint_as_float((j % 2 == 0) ? (w[j / 2] << 16) : (w[j / 2] & 0xffff0000u));
}

/** @brief v[0..N) into p[0..N) (f32; N 1, 2 or 4). */
template <int N>
__device__ __forceinline__ void store_vec(float* p, const float (&v)[N]) {
  static_assert(N == 1 || N == 2 || N == 4, "f32 vectors of 1, 2 or 4 elements");
  if constexpr (N == 4) {
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  } else if constexpr (N == 2) {
    *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
  } else {
    *p = v[0];
  }
}

/** @brief The 32-bit words w[0..N) into the 4·N bytes at p (N 1, 2 or 4: one st.global.b32/.v2/.v4), e.g. an
 *  accumulator row's column pairs packed (bf16x2) or as float bits, gathered by habu/lower/quad_vectors.py's
 *  exchange. p must be 4·N-byte aligned. */
template <int N>
__device__ __forceinline__ void store_words(void* p, const u32 (&w)[N]) {
  static_assert(N == 1 || N == 2 || N == 4, "1, 2 or 4 words");
  if constexpr (N == 4) {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  } else if constexpr (N == 2) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    *reinterpret_cast<u32*>(p) = w[0];
  }
}

/** @brief Element e of the 16-bit elements packed in words w (pack_bf16x2's order: element 2i the low half of
 *  word i): where a vector of packed words cannot be stored whole, its elements one at a time. */
template <int N>
__device__ __forceinline__ unsigned short word_half(const u32 (&w)[N], int e) {
  return (unsigned short)(w[e >> 1] >> (16 * (e & 1)));
}

/** @brief v[0..N) rounded to bf16 (to nearest even, as store_bf16) into p[0..N) (N 1, 2, 4 or 8). */
template <int N>
__device__ __forceinline__ void store_vec(bf16* p, const float (&v)[N]) {
  static_assert(N == 1 || N == 2 || N == 4 || N == 8, "bf16 vectors of 1, 2, 4 or 8 elements");
  if constexpr (N == 1) {
    *p = float_to_bf16(v[0]);
  } else {
    u32 w[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) w[i] = pack_bf16x2(v[2 * i], v[2 * i + 1]);
    store_words<N / 2>(p, w);
  }
}

/** @brief Adds v[0..N) into p[0..N) (f32, N 1, 2 or 4): one vector reduction (red.global.add.v2/.v4.f32) on
 *  sm_90+, N atomicAdds before. Each element's addition is atomic, as atomicAdd's. */
template <int N>
__device__ __forceinline__ void red_add_vec(float* p, const float (&v)[N]) {
  static_assert(N == 1 || N == 2 || N == 4, "f32 vectors of 1, 2 or 4 elements");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (N == 4) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3])
                 : "memory");
  } else if constexpr (N == 2) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(v[0]), "f"(v[1]) : "memory");
  } else {
    atomicAdd(p, v[0]);
  }
#else
#pragma unroll
  for (int j = 0; j < N; ++j) atomicAdd(p + j, v[j]);
#endif
}

}  // namespace habu
