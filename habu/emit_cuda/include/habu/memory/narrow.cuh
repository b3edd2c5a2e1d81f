/** @brief An index tensor narrowed on the device to the integer type a kernel reads (torch's int64
 *  index handed to a kernel that loads i32), in one launch per call: saturating, so a value outside the
 *  narrower type stays outside every index range and the kernel's own check (habu::index_ok) reports
 *  it, never wrapped into range. Used by the runtime's per-call path (habu/emit_cuda/narrow.py). */
#pragma once
#include "../types.cuh"

namespace habu {

/** @brief `value` clamped to [lo, hi] and converted to To. */
template <typename To>
__device__ __forceinline__ To saturate(i64 value, i64 lo, i64 hi) {
  return (To)(value < lo ? lo : value > hi ? hi : value);
}

/** @brief out[i] = saturate(in[i]) for i < n (both contiguous). */
template <typename From, typename To>
__device__ __forceinline__ void narrow_index(const From* __restrict__ in, To* __restrict__ out, i64 n, i64 lo,
                                             i64 hi) {
  const i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = saturate<To>((i64)in[i], lo, hi);
}

}  // namespace habu

#define HABU_NARROW_INDEX(NAME, FROM, TO, LO, HI)                                                   \
  extern "C" __global__ void NAME(const FROM* __restrict__ in, TO* __restrict__ out, habu::i64 n) { \
    habu::narrow_index<FROM, TO>(in, out, n, (LO), (HI));                                            \
  }
