/** @brief Block-wide reductions of one float per thread (sum, max), for row kernels. */
#pragma once
#include "../math.cuh"

namespace habu {

/**
 * @brief Reduce `part` over the block: each warp with shuffles, its lane 0 writes `scratch[warp]`,
 * then warp 0 combines the partials of the first `warps` warps and writes the result to `scratch[32]`.
 * `scratch` holds 33 floats. Every thread of the block must call it (two barriers); the result is in
 * `scratch[32]` when it returns. `warps` is the lowering's `combined_warps` (every warp with a thread);
 * `init` is the reduction's identity (0 for a sum, the lowest float for a max).
 */
template <bool IsMax>
__device__ __forceinline__ void block_reduce(float part, float* scratch, int warps, float init) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  part = IsMax ? warp_max(part) : warp_sum(part);
  if (lane == 0) scratch[warp] = part;
  __syncthreads();
  if (warp == 0) {
    float w = lane < warps ? scratch[lane] : init;
    w = IsMax ? warp_max(w) : warp_sum(w);
    if (lane == 0) scratch[32] = w;
  }
  __syncthreads();
}

}  // namespace habu
