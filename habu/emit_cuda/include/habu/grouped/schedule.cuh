/** @brief The grouped GEMM's tile scheduler (habu/lower/grouped.py): group offsets found on the device by
 *  a binary search per group over the grouping's values, the row tiles' prefix sum, and a row tile's group. */
#pragma once
#include "../types.cuh"
#include "../memory/index.cuh"

namespace habu {

/** @brief offs[g] = the first row whose group is >= g (rows when none), for g in 0..groups, by the block's
 *  threads (one binary search each), into shared memory; the caller synchronises. */
template <typename I, typename E>
__device__ __forceinline__ void group_offsets(const E* __restrict__ groups_of_rows, I rows, int groups, I* offs) {
  for (int g = threadIdx.x; g <= groups; g += blockDim.x) {
    I lo = 0, hi = rows;
    while (lo < hi) {
      const I mid = (lo + hi) / 2;
      if ((long long)groups_of_rows[mid] < (long long)g) lo = mid + 1; else hi = mid;
    }
    offs[g] = lo;
  }
}

/** @brief The first row whose group is >= t (rows when none), found by the calling warp (every lane gets it) in
 *  rounds: the warp's 32 lanes read E at the last row of each of 32 equal parts of [lo, hi) (parts of
 *  ⌈(hi − lo)/32⌉ rows), and the count n of lanes reading a group below t (a ballot) gives lo += n·part, hi =
 *  min(hi, old lo + (n + 1)·part − 1): three dependent reads of E for 8192 rows where a binary search makes 14.
 *  `Rounds` (the lowering's `search_rounds` for the rows) bounds the rounds; the lowering's
 *  `GroupedWgradLowering.lower_bound` is this search. */
template <typename I, int Rounds, typename E>
__device__ __forceinline__ I warp_lower_bound(const E* __restrict__ groups_of_rows, I rows, int t) {
  const int lane = threadIdx.x % 32;
  I lo = 0, hi = rows;
#pragma unroll 1
  for (int round = 0; round < Rounds && lo < hi; ++round) {  // (lo, hi: the same in every lane)
    const I part = (hi - lo + 31) / 32;
    const I probe = lo + (I)(lane + 1) * part - 1;
    const bool below = probe < hi && (long long)groups_of_rows[probe] < (long long)t;
    const I n = (I)__popc(__ballot_sync(0xffffffffu, below));
    const I top = lo + (n + 1) * part - 1;
    lo += n * part;
    hi = top < hi ? top : hi;
  }
  return lo;
}

/** @brief offs[t] for the four groups t0..t3 (the block's group, the next, the first and the last; repeats
 *  allowed), each by one warp of the block (warps 0..3, `warp_lower_bound`). Needs 128 threads; the caller
 *  synchronises. */
template <typename I, int Rounds, typename E>
__device__ __forceinline__ void group_offsets_warp(const E* __restrict__ groups_of_rows, I rows, int t0, int t1, int t2,
                                                   int t3, I* offs) {
  const int warp = threadIdx.x / 32;
  if (warp >= 4) return;
  const int t = warp == 0 ? t0 : warp == 1 ? t1 : warp == 2 ? t2 : t3;  // (no local array indexed by the warp)
  const I lo = warp_lower_bound<I, Rounds>(groups_of_rows, rows, t);
  if (threadIdx.x % 32 == 0) offs[t] = lo;
}

/** @brief offs[t] for every group t in 0..groups (a persistent block's offsets, found once), warp w of the block
 *  taking t = w, w + the block's warps, ... (`warp_lower_bound`). The caller synchronises. */
template <typename I, int Rounds, typename E>
__device__ __forceinline__ void group_offsets_warps(const E* __restrict__ groups_of_rows, I rows, int groups,
                                                    I* offs) {
  const int warps = blockDim.x / 32;
#pragma unroll 1
  for (int t = threadIdx.x / 32; t <= groups; t += warps) {
    const I lo = warp_lower_bound<I, Rounds>(groups_of_rows, rows, t);
    if (threadIdx.x % 32 == 0) offs[t] = lo;
  }
}

/** @brief starts[g] = the row tiles of groups 0..g-1 (`tiles_of(offs, h)` those of group h: the lowering's
 *  m_tiles, an empty group none), g in 0..groups, by the first warp (a shuffle scan 32 groups at a time);
 *  the caller synchronises. */
template <typename I, typename TilesOf>
__device__ __forceinline__ void group_tile_starts(TilesOf tiles_of, const I* offs, int groups, I* starts) {
  if (threadIdx.x >= 32) return;
  const unsigned lane = threadIdx.x;
  I carry = 0;
  if (lane == 0) starts[0] = 0;
  for (int base = 0; base < groups; base += 32) {
    const int g = base + (int)lane;
    I tiles = g < groups ? tiles_of(offs, g) : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const I up = __shfl_up_sync(0xffffffffu, tiles, d);
      if (lane >= (unsigned)d) tiles += up;
    }
    if (g < groups) starts[g + 1] = carry + tiles;
    carry += __shfl_sync(0xffffffffu, tiles, 31);
  }
}

/** @brief The group of row tile mt (mt < starts[groups]): the last g < groups with starts[g] <= mt. */
template <typename I>
__device__ __forceinline__ int tile_group(const I* starts, int groups, I mt) {
  int lo = 0, hi = groups - 1;  // starts[0] = 0 <= mt: the answer is in lo..hi
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (starts[mid] <= mt) lo = mid; else hi = mid - 1;
  }
  return lo;
}

/** @brief Whether row `position` of a grouping holds `group`, the group whose rows (by the offsets) it lies in.
 *  When it does not, the grouping's values decrease somewhere (GROUPS: forbids it): sets bit `code` of the
 *  error words and, the first time, records the position and the value with size 0, which marks an order
 *  error (habu.emit_cuda.device_errors.describe says it). The tile is computed regardless; its rows are
 *  then not valid. */
__device__ __forceinline__ bool grouping_ok(i64 value, i64 group, u32 code, i64 position) {
  if (value == group) return true;
  record_index_error(code, position, value, 0);
  return false;
}

}  // namespace habu
