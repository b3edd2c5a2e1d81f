/** @brief Column reductions (`G[n] = Σ r dY[r n]`): packed loads of adjacent columns, their elements as
 * floats, f32 accumulation (the store, direct or atomic, is memory/global.cuh's).
 * Every index is the lowering's (habu/lower/columns.py), printed by habu/emit_cuda/emit_columns.py. */
#pragma once
#include "../types.cuh"
#include "../memory/global.cuh"

namespace habu {

/** @brief A packed vector of `Bytes` bytes (4, 8 or 16): the register type one load fills. */
template <int Bytes> struct packed;
template <> struct packed<4> { typedef u32 type; };
template <> struct packed<8> { typedef uint2 type; };
template <> struct packed<16> { typedef uint4 type; };

/** @brief `Bytes` bytes from global memory at `p` (aligned to `Bytes`), or zeros when `pred` is false
 * (no access is made then). */
template <int Bytes>
__device__ __forceinline__ typename packed<Bytes>::type load_packed(const void* p, bool pred);
template <> __device__ __forceinline__ u32 load_packed<4>(const void* p, bool pred) { return load4_or_zero(p, pred); }
template <> __device__ __forceinline__ uint2 load_packed<8>(const void* p, bool pred) { return load8_or_zero(p, pred); }
template <> __device__ __forceinline__ uint4 load_packed<16>(const void* p, bool pred) { return load16_or_zero(p, pred); }

/** @brief Element `i` (a compile-time index after unrolling) of a packed vector of bf16, as float. */
template <typename Raw>
__device__ __forceinline__ float packed_bf16(const Raw& raw, int i) {
  return bf16_to_float(reinterpret_cast<const bf16*>(&raw)[i]);
}

/** @brief Element `i` of a packed vector of f16, as float. */
template <typename Raw>
__device__ __forceinline__ float packed_f16(const Raw& raw, int i) {
  return f16_to_float(reinterpret_cast<const f16*>(&raw)[i]);
}

/** @brief Element `i` of a packed vector of f32. */
template <typename Raw>
__device__ __forceinline__ float packed_f32(const Raw& raw, int i) {
  return reinterpret_cast<const float*>(&raw)[i];
}

/** @brief Fold `value` into the running reduction `acc`: a sum, or a max. */
template <bool IsMax>
__device__ __forceinline__ void accumulate(float& acc, float value) {
  acc = IsMax ? fmaxf(acc, value) : acc + value;
}

/** @brief The order-preserving integer key of a float: `a < b` as floats exactly when
 * `ordered_key(a) < ordered_key(b)` as unsigned integers (a non-negative float's bits with the sign bit
 * set; a negative float's bits inverted). Key 0 is below every float's but a NaN's with every bit set:
 * a zero-filled output is the identity of a max over keys. */
__device__ __forceinline__ u32 ordered_key(float v) {
  const u32 bits = __float_as_uint(v);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

/** @brief The float whose `ordered_key` is `key`. */
__device__ __forceinline__ float from_ordered_key(u32 key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

/** @brief A row split's partial max `v` combined into the output element `p` (zero-filled before the
 * launch) as its `ordered_key`: after every split, `p` holds the key of the max, which the column
 * tile's last block (`last_block_done`) turns back into the float (`decode_ordered`). */
__device__ __forceinline__ void atomic_max_ordered(float* p, float v) {
  atomicMax(reinterpret_cast<unsigned int*>(p), ordered_key(v));
}

/** @brief The float of the key an output element holds, written over it (run by the tile's last block only). */
__device__ __forceinline__ void decode_ordered(float* p) {
  volatile unsigned int* q = reinterpret_cast<volatile unsigned int*>(p);
  *q = __float_as_uint(from_ordered_key(*q));
}

/** @brief Whether this block is the last of the `arrivals` blocks that count themselves on `counter`
 * (every one of them calls it once, after its atomics): the CUDA threadFenceReduction pattern. The
 * counter is a slot of a workspace of this launch (one per column tile), which the runtime allocates
 * per call in the stream's order and zero-fills before the launch: launches on two streams never share
 * a counter, and a launch that died midway leaves nothing behind for the next. */
__device__ __forceinline__ bool last_block_done(int* counter, int arrivals) {
  __shared__ bool is_last;
  __threadfence();  // this block's atomics are visible to every block before it counts itself
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == arrivals - 1;
  __syncthreads();
  if (is_last) __threadfence();
  return is_last;
}

/** @brief `last_block_done` among `threads` threads of the block (a multiple of 32, thread `leader` one of
 * them), synchronised on hardware barrier `id` (1..15) instead of __syncthreads: a warp-specialised kernel's
 * consumer warpgroups while its producer warpgroup has left (it holds fewer registers: setmaxnreg). The
 * leader's answer reaches the others by the barrier's reduction (bar.red.or), not by shared memory. */
__device__ __forceinline__ bool last_block_done_among(int* counter, int arrivals, int id, int threads, int leader) {
  __threadfence();  // this thread's partial is visible to every block before the leader counts the block
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(threads) : "memory");
  int mine = 0;
  if ((int)threadIdx.x == leader) mine = atomicAdd(counter, 1) == arrivals - 1;
  int last;
  asm volatile(
      "{\n"
      ".reg .pred p, q;\n"
      "setp.ne.s32 p, %1, 0;\n"
      "bar.red.or.pred q, %2, %3, p;\n"
      "selp.s32 %0, 1, 0, q;\n"
      "}\n" : "=r"(last) : "r"(mine), "r"(id), "r"(threads) : "memory");
  if (last) __threadfence();
  return last != 0;
}

}  // namespace habu
