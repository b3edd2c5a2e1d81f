/** @brief Index values checked on the device: a gather's or scatter's index outside its axis masks the
 *  element and raises the module's sticky error words, which the runtime reads at habu.check_errors()
 *  (docs/ARCHITECTURE.md, "Index values"). */
#pragma once
#include "../types.cuh"

/** @brief The error words of this module (one per loaded module and context, zero when loaded; the
 *  host finds them with cuModuleGetGlobal("habu_index_errors") and zeroes them after reading):
 *  [0] one bit per index tensor of the model (its code) that held a value outside its range;
 *  [1] the first recorded error's code + 1 (0: none); [2..3] its position, [4..5] its value, [6..7] the
 *  size of the axis it indexes (64-bit values as lo, hi). */
extern "C" __device__ habu::u32 habu_index_errors[8] = {0u, 0u, 0u, 0u, 0u, 0u, 0u, 0u};

namespace habu {

/** @brief Whether `value` (an index tensor's element at `position`) is in 0..size-1. When it is not,
 *  sets bit `code` of the error word and, the first time, records code, position, value and size; the caller
 *  masks the access, so no memory outside the indexed tensor is read or written. */
__device__ __forceinline__ bool index_ok(i64 value, i64 size, u32 code, i64 position) {
  if (value >= 0 && value < size) return true;
  atomicOr(habu_index_errors, 1u << code);
  if (atomicCAS(habu_index_errors + 1, 0u, code + 1u) == 0u) {
    habu_index_errors[2] = (u32)((u64)position & 0xffffffffull);
    habu_index_errors[3] = (u32)((u64)position >> 32);
    habu_index_errors[4] = (u32)((u64)value & 0xffffffffull);
    habu_index_errors[5] = (u32)((u64)value >> 32);
    habu_index_errors[6] = (u32)((u64)size & 0xffffffffull);
    habu_index_errors[7] = (u32)((u64)size >> 32);
  }
  return false;
}

}  // namespace habu
