"""The seed's own Triton kernel (Triton #10927, as "Why Habu" shows it), as a baseline.

Both paths of the seed: pointer + masked loads (USE_TD=False), and the tensor-descriptor gather
(USE_TD=True), which needs Blackwell's TMA gather4 (on Hopper Triton cannot build it: reported, not hidden).
"""

from __future__ import annotations

from typing import Any


def build():
    import torch
    import triton
    import triton.language as tl

    def alloc(size: int, alignment: int, stream: Any):
        return torch.empty(size, dtype=torch.int8, device="cuda")

    triton.set_allocator(alloc)

    @triton.jit
    def gemm_gather_kernel(a_ptr, b_ptr, c_ptr, ix_ptr, M, N, K, stride_am, stride_ak, stride_bn, stride_bk,
                           stride_cm, stride_cn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, USE_TD: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_k = tl.arange(0, BLOCK_K)
        rows = tl.load(ix_ptr + offs_m)  # A[IX[m]]: the gather the seed's issue is about
        if USE_TD:
            a_desc = tl.make_tensor_descriptor(base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
                                               block_shape=(1, BLOCK_K))
            b_desc = tl.make_tensor_descriptor(base=b_ptr, shape=(N, K), strides=(stride_bn, stride_bk),
                                               block_shape=(BLOCK_N, BLOCK_K))
        else:
            a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak
            b_ptrs = b_ptr + offs_n[:, None] * stride_bn + offs_k[None, :] * stride_bk
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            if USE_TD:
                a = a_desc.gather(rows.to(tl.int32), k * BLOCK_K)
                b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K]).T
            else:
                k_mask = offs_k < K - k * BLOCK_K
                a = tl.load(a_ptrs, mask=k_mask[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=k_mask[None, :], other=0.0)
                b = tl.trans(b)
            acc += tl.dot(a, b)
            if not USE_TD:
                a_ptrs += BLOCK_K * stride_ak
                b_ptrs += BLOCK_K * stride_bk
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc)

    def run(a, b, ix, use_td: bool, out=None):
        M, K = a.shape
        N = b.shape[0]
        out = out if out is not None else torch.empty((M, N), dtype=torch.float32, device=a.device)
        grid = (M // 128, N // 128)
        gemm_gather_kernel[grid](a, b, out, ix, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                 out.stride(0), out.stride(1), BLOCK_M=128, BLOCK_N=128, BLOCK_K=64,
                                 USE_TD=use_td, num_warps=8, num_stages=3)
        return out

    return run
