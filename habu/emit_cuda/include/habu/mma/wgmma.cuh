/** @brief Warpgroup tensor cores (sm_90a): shared-memory descriptors and the fence/commit/wait protocol.
 *  The m64nNk16 instructions themselves are generated per N by habu/emit_cuda/wgmma.py. */
#pragma once
#include "../types.cuh"

namespace habu {

/** @brief Descriptor of a K-major tile with 128-byte swizzle: rows of 128 bytes, 8-row atoms of 1024 bytes. */
__device__ __forceinline__ u64 wgmma_desc_sw128(u32 smem_byte_addr) {
  u64 d = 0;
  d |= (u64)((smem_byte_addr & 0x3FFFF) >> 4);
  d |= (u64)1 << 16;                  // leading byte offset (unused for swizzled K-major): 16 bytes
  d |= (u64)(1024 >> 4) << 32;        // stride byte offset: one 8-row atom
  d |= (u64)1 << 62;                  // swizzle mode: 128 bytes
  return d;
}
/** @brief Descriptor of an MN-major tile with 128-byte swizzle, stored as column blocks: each block is 64
 *  16-bit elements of N (one 128-byte row) by the tile's k rows, `block_bytes` apart; 8-row atoms of
 *  1024 bytes along k. The instruction reads it with its transpose bit set. */
__device__ __forceinline__ u64 wgmma_desc_sw128_mn(u32 smem_byte_addr, u32 block_bytes) {
  u64 d = 0;
  d |= (u64)((smem_byte_addr & 0x3FFFF) >> 4);
  d |= (u64)((block_bytes & 0x3FFFF) >> 4) << 16;  // leading byte offset: from one 64-column block to the next
  d |= (u64)(1024 >> 4) << 32;                      // stride byte offset: from 8 k rows to the next 8
  d |= (u64)1 << 62;                                // swizzle mode: 128 bytes
  return d;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" :: "n"(N) : "memory"); }
template <int Regs>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" :: "n"(Regs)); }
template <int Regs>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" :: "n"(Regs)); }

/** @brief Byte offset of element (row, 16-byte chunk) in a tile of 128-byte rows stored with the 128B swizzle
 *  (the pattern TMA writes and wgmma reads): chunk ^= row % 8. */
__device__ __forceinline__ u32 swizzle128(u32 row, u32 chunk) { return row * 128u + ((chunk ^ (row & 7u)) << 4); }

/** @brief Descriptor of a tile from its layout fields, as the lowering gives them (habu/lower/layouts.py,
 *  WgmmaDescriptor): leading and stride byte offsets, swizzle mode (0 none, 1 128B, 2 64B, 3 32B). */
template <u32 LBO, u32 SBO, u32 Mode>
__device__ __forceinline__ u64 wgmma_desc(u32 smem_byte_addr) {
  static_assert(LBO % 16 == 0 && SBO % 16 == 0 && Mode < 4, "descriptor fields are 16-byte units");
  u64 d = 0;
  d |= (u64)((smem_byte_addr & 0x3FFFF) >> 4);
  d |= (u64)((LBO & 0x3FFFF) >> 4) << 16;
  d |= (u64)((SBO & 0x3FFFF) >> 4) << 32;
  d |= (u64)Mode << 62;
  return d;
}

}  // namespace habu
