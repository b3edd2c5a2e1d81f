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

/** @brief Records an error of index tensor `code` in the module's error words: its bit, and, for the first
 *  error only, code, position, value and `size` (the size of the axis indexed; 0 marks a grouping out of
 *  order, `grouping_ok`). */
__device__ __forceinline__ void record_index_error(u32 code, i64 position, i64 value, i64 size) {
  atomicOr(habu_index_errors, 1u << code);
  if (atomicCAS(habu_index_errors + 1, 0u, code + 1u) == 0u) {
    habu_index_errors[2] = (u32)((u64)position & 0xffffffffull);
    habu_index_errors[3] = (u32)((u64)position >> 32);
    habu_index_errors[4] = (u32)((u64)value & 0xffffffffull);
    habu_index_errors[5] = (u32)((u64)value >> 32);
    habu_index_errors[6] = (u32)((u64)size & 0xffffffffull);
    habu_index_errors[7] = (u32)((u64)size >> 32);
  }
}

/** @brief Whether `value` (an index tensor's element at `position`) is in 0..size-1. When it is not,
 *  records the error (`record_index_error`); the caller masks the access, so no memory outside the indexed
 *  tensor is read or written. */
__device__ __forceinline__ bool index_ok(i64 value, i64 size, u32 code, i64 position) {
  if (value >= 0 && value < size) return true;
  record_index_error(code, position, value, size);
  return false;
}

}  // namespace habu
