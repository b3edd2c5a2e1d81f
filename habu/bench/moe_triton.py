"""A Triton grouped GEMM for the MoE layer, written for the benchmark (issue 20 §1's third baseline; bench code,
not the product), autotuned over `CONFIGS` in the same run.

The layer as serving stacks run it with Triton (vLLM's fused-MoE layout): W1 and W3 concatenated once into
W13[E, 2H, D] (outside the timed call), then
  1. gate|up = grouped GEMM of X's rows gathered through IX by W13[E[r]] (one launch over every expert's tiles),
  2. act = silu(gate) · up (torch, bf16),
  3. z = P[r] · act[r] · W2[E[r]]ᵀ (one launch, the router weight in the epilogue, f32), Y.index_add_(0, IX, z).
The tile map (each program's expert and first row) is computed on the device from the expert offsets by torch
ops (no host round trip): an expert of c rows has ⌈c/BM⌉ row tiles, the grid's bound ⌊(R + E·(BM − 1))/BM⌋;
programs past the last tile return. Each GEMM takes the fastest of `CONFIGS` (BM, BN, BK, warps, stages),
each timed (habu.timing.harness.time_cuda) after its output was checked against torch (`autotune`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from habu.timing.harness import time_cuda, torch


@dataclass(frozen=True)
class Config:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int

    def __str__(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk} w{self.warps} s{self.stages}"


# large tiles for many rows an expert, small row tiles for decode-size batches (a few rows an expert)
CONFIGS = (Config(128, 256, 64, 8, 3), Config(128, 128, 64, 8, 4), Config(128, 128, 64, 4, 4),
           Config(64, 256, 64, 8, 4), Config(64, 128, 64, 4, 4), Config(128, 64, 64, 4, 4),
           Config(64, 64, 128, 4, 4), Config(32, 128, 128, 4, 4), Config(16, 128, 128, 4, 5),
           Config(16, 64, 256, 4, 4))


@cache
def _kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def grouped_gemm(a_ptr, ix_ptr, w_ptr, c_ptr, p_ptr, tile_group_ptr, tile_row_ptr, offs_ptr, N, K,
                     stride_a, stride_wg, stride_wn, stride_c, GATHER: tl.constexpr, ROW_SCALE: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        g = tl.load(tile_group_ptr + pid_m)
        if g >= 0:
            row0 = tl.load(tile_row_ptr + pid_m)
            end = tl.load(offs_ptr + g + 1)
            rows = row0 + tl.arange(0, BLOCK_M)
            inside = rows < end
            if GATHER:
                a_rows = tl.load(ix_ptr + rows, mask=inside, other=0).to(tl.int64)
            else:
                a_rows = rows.to(tl.int64)
            cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            ks = tl.arange(0, BLOCK_K)
            a_ptrs = a_ptr + a_rows[:, None] * stride_a + ks[None, :]
            w_ptrs = w_ptr + g.to(tl.int64) * stride_wg + cols[None, :].to(tl.int64) * stride_wn + ks[:, None]
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for _ in range(0, K, BLOCK_K):  # K a multiple of BLOCK_K (checked by the caller)
                a = tl.load(a_ptrs, mask=inside[:, None], other=0.0)
                w = tl.load(w_ptrs, mask=cols[None, :] < N, other=0.0)
                acc = tl.dot(a, w, acc)
                a_ptrs += BLOCK_K
                w_ptrs += BLOCK_K
            if ROW_SCALE:
                acc = acc * tl.load(p_ptr + rows, mask=inside, other=0.0)[:, None]
            c_ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_c + cols[None, :]
            tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=inside[:, None] & (cols[None, :] < N))

    return grouped_gemm


def grouped_gemm(a, ix, w, offsets, rows: int, config: Config, out_dtype, p=None) -> Any:
    """C[r] = (P[r] ·) A[IX[r] or r] · W[E[r]]ᵀ for r in 0..rows−1, E given by the expert `offsets` (ends)."""
    t = torch()
    experts, n, k = w.shape
    # the tile map on the device, no host sync: an expert of c rows has ⌈c/bm⌉ row tiles (an empty one none),
    # the grid's row programs ⌊(R + E·(bm − 1))/bm⌋ bound them for any routing; those past the last return
    if k % config.bk:
        raise ValueError(f"K {k} is not a multiple of BLOCK_K {config.bk}")
    bm = config.bm
    grid_m = (rows + experts * (bm - 1)) // bm
    ends = offsets.long()
    starts = t.cat([ends.new_zeros(1), ends[:-1]])
    tiles = (ends - starts + bm - 1) // bm
    cum = t.cumsum(tiles, 0)
    pid = t.arange(grid_m, device=a.device)
    group = t.searchsorted(cum, pid, right=True)
    live = group < experts
    group = group.clamp_max(experts - 1)
    row0 = starts[group] + (pid - (cum - tiles)[group]) * bm
    tile_group = t.where(live, group, -1).int()
    offs = t.cat([offsets.new_zeros(1), offsets]).int()
    out = t.empty((rows, n), dtype=out_dtype, device=a.device)
    grid = (grid_m, -(-n // config.bn))
    _kernel()[grid](a, ix if ix is not None else a, w, out, p if p is not None else out, tile_group, row0.int(), offs,
                    n, k, a.stride(0), w.stride(0), w.stride(1), out.stride(0), GATHER=ix is not None,
                    ROW_SCALE=p is not None, BLOCK_M=bm, BLOCK_N=config.bn, BLOCK_K=config.bk,
                    num_warps=config.warps, num_stages=config.stages)
    return out


def autotune(fn_of_config, check, configs=CONFIGS) -> tuple[Config, float, list[str]]:
    """The fastest config of `configs` whose output passes `check` (each timed: median of 10 calls), its µs,
    and why the others have no time."""
    best: tuple[Config, float] | None = None
    notes = []
    for cfg in configs:
        try:
            got = fn_of_config(cfg)
            torch().cuda.synchronize()
            why = check(got)
            if why:
                notes.append(f"{cfg}: {why}")
                continue
            us = time_cuda(lambda i, c=cfg: fn_of_config(c), 1, warmup=2, reps=10)["median_us"]
        except Exception as exc:  # a config Triton cannot build (shared memory): noted, not timed
            notes.append(f"{cfg}: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        if best is None or us < best[1]:
            best = (cfg, us)
    if best is None:
        raise RuntimeError("no Triton config ran: " + "; ".join(notes[:3]))
    return best[0], best[1], notes


class TritonLayer:
    """The MoE layer through the Triton grouped GEMM, each GEMM's config autotuned on the call's inputs."""

    def __init__(self, w: dict[str, Any]):
        t = torch()
        self.w13 = t.cat([w["W1"], w["W3"]], dim=1).contiguous()  # [E, 2H, D]: one GEMM for gate and up
        self.w2 = w["W2"]
        self.h = w["W1"].shape[1]
        self.up_config: Config | None = None
        self.down_config: Config | None = None
        self.up_us = self.down_us = 0.0
        self.notes: list[str] = []

    def tune(self, x, ix, p, offsets) -> None:
        t = torch()
        rows = ix.numel()
        # check each config against torch's grouped product on the same rows (bf16 operands, f32 sums)
        bounds = [0, *offsets.tolist()]
        xs = x[ix.long()]

        def gu_ref():
            out = t.empty((rows, 2 * self.h), dtype=t.float32, device=x.device)
            for g in range(len(bounds) - 1):
                if bounds[g + 1] > bounds[g]:
                    out[bounds[g]:bounds[g + 1]] = xs[bounds[g]:bounds[g + 1]].float() @ self.w13[g].float().T
            return out

        want = gu_ref()

        def close(got, ref) -> str:
            err = float((got.float() - ref).norm() / ref.norm().clamp_min(1e-30))
            return "" if err <= 2e-2 else f"relative error {err:.1e}"

        self.up_config, self.up_us, notes = autotune(
            lambda c: grouped_gemm(x, ix, self.w13, offsets, rows, c, x.dtype), lambda got: close(got, want))
        self.notes += notes
        gu = grouped_gemm(x, ix, self.w13, offsets, rows, self.up_config, x.dtype)
        act = (t.nn.functional.silu(gu[:, :self.h]) * gu[:, self.h:]).contiguous()
        want_z = t.empty((rows, self.w2.shape[1]), dtype=t.float32, device=x.device)
        for g in range(len(bounds) - 1):
            if bounds[g + 1] > bounds[g]:
                want_z[bounds[g]:bounds[g + 1]] = p[bounds[g]:bounds[g + 1], None] * (
                    act[bounds[g]:bounds[g + 1]].float() @ self.w2[g].float().T)
        self.down_config, self.down_us, notes = autotune(
            lambda c: grouped_gemm(act, None, self.w2, offsets, rows, c, t.float32, p), lambda got: close(got, want_z))
        self.notes += notes

    def __call__(self, x, ix, p, offsets, y) -> Any:
        t = torch()
        rows = ix.numel()
        gu = grouped_gemm(x, ix, self.w13, offsets, rows, self.up_config, x.dtype)
        act = t.nn.functional.silu(gu[:, :self.h]) * gu[:, self.h:]
        z = grouped_gemm(act, None, self.w2, offsets, rows, self.down_config, t.float32, p)
        out = y.clone()
        out.index_add_(0, ix.long(), z)
        return out

    def describe(self) -> str:
        return f"up {self.up_config} {self.up_us:.0f} µs, down {self.down_config} {self.down_us:.0f} µs"


__all__ = ["CONFIGS", "Config", "TritonLayer", "autotune", "grouped_gemm"]
