"""The plans `habu.bench.derived_lines` measures: each path's representative example, shape, pins and target."""

from __future__ import annotations

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# (path label, example, model, shape, pins, target)
CASES: tuple[tuple[str, str, str, dict[str, int], dict[str, str], str], ...] = (
    ("wgmma tma", "gemm.habu", "GEMM", {}, {}, "sm_90a"),
    ("wgmma gather cp.async + tma", "ggemm.habu", "GGEMM", {}, {}, "sm_90a"),
    ("wgmma ldg, K=511", "ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 511}, {"A": "ldg", "B": "ldg"}, "sm_90a"),
    ("wgmma staged, K=511", "ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 511}, {}, "sm_90a"),
    # session 71: operands whose innermost index is the batch axis, staged by (batch, k) tiles through shared memory
    ("wgmma staged by batch tiles (batch-innermost operands, #S = 13)", "../tests/data/batched_staged.habu",
     "BATCH-INNERMOST", {"S": 13}, {}, "sm_90a"),
    ("wgmma tma, n-contiguous B (FFN-SKIP: 2 GEMMs + rows)", "ffn_skip.habu", "FFN-SKIP", {}, {}, "sm_90a"),
    ("wgmma tma batched (bmm: TMA-store box 1 per batch)", "bmm.habu", "SCORES", {"B": 3, "I": 72, "J": 80, "D": 64},
     {}, "sm_90a"),
    ("mma.sync", "ggemm.habu", "GGEMM", {"M": 300, "N": 200, "K": 520}, {"mma": "mma.sync"}, "sm_80"),
    ("fma split-k", "ggemm.habu", "GGEMM", {"M": 130, "N": 70, "K": 33}, {"mma": "fma", "split_k": "2"}, "sm_80"),
    ("rows softmax", "softmax.habu", "SOFTMAX-ROWS", {}, {}, "sm_90a"),
    ("rows rmsnorm", "rmsnorm.habu", "RMSNORM-ROWS", {"D": 4096}, {}, "sm_90a"),
    ("rows softmax smem, C=1000", "softmax.habu", "SOFTMAX-ROWS", {"C": 1000}, {"threads": "128"}, "sm_90a"),
    ("rows softmax cluster", "softmax.habu", "SOFTMAX-ROWS", {"C": 131072}, {}, "sm_90a"),
    ("map", "fused.habu", "AXPY-RELU", {}, {}, "sm_90a"),
    ("general", "weighted_scores.habu", "SCORES", {}, {}, "sm_90a"),
    ("columns", "bias_grad.habu", "BIAS-GRAD", {}, {}, "sm_90a"),
    ("columns, epilogue by each tile's last split", "column_reductions.habu", "BIAS-GRAD-UNSCALED", {}, {},
     "sm_90a"),
    ("grouped (MoE: gate, up, act rows, combine scatter-add)", "moe_mixtral.habu", "MOE-FFN", {"T": 64, "R": 128},
     {"family": "grouped"}, "sm_90a"),
    ("grouped wgmma (MoE: gate, up on the wgmma loop, act rows, combine scatter-add)", "moe_mixtral.habu", "MOE-FFN",
     {"T": 64, "R": 128}, {"family": "grouped", "main_loop": "wgmma"}, "sm_90a"),
    ("grouped wgmma, pair fused (gate + up + SwiGLU; combine scatter-add)", "moe_mixtral.habu", "MOE-FFN",
     {"T": 64, "R": 128}, {"family": "grouped", "main_loop": "wgmma", "pair": "fused"}, "sm_90a"),
    ("scatter-add (general, atomic)", "scatter_add.habu", "UNPERMUTE", {}, {}, "sm_90a"),
    ("attention unfused (wgmma scores, softmax, mma.sync PV)", "attention.habu", "ATTENTION-GQA", {}, {}, "sm_90a"),
    ("attention fused (mma.sync, online softmax)", "attention.habu", "ATTENTION-GQA", {}, {"family": "attention"},
     "sm_90a"),
    ("attention fused, causal skip (70 queries at the end of 100 keys, 32×32 tiles, 2 row tiles a warp)", "attention.habu",
     "ATTENTION-GQA", {"I": 70, "J": 100}, {"family": "attention", "bm": "32", "bn": "32", "warp_m": "2"}, "sm_90a"),
    ("attention fused, split-KV decode (lengths, 4096 keys in splits of 512)", "decode_attention.habu",
     "DECODE-ATTENTION", {"J": 4096, "L": 4097},
     {"family": "attention", "bm": "16", "kv_split": "512", "kv_warps": "1", "stages": "2"}, "sm_90a"),
    ("attention fused, sliced split-KV decode (4 warps a block, each 16 keys of a tile, merged; 3 K/V buffers)",
     "decode_attention.habu", "DECODE-ATTENTION", {"J": 4096, "L": 4097},
     {"family": "attention", "bm": "16", "bn": "64", "kv_split": "512", "kv_warps": "4", "stages": "3"}, "sm_90a"),
    ("attention fused, wgmma/TMA main loop (FA3-style, 2 consumer warpgroups)", "attention.habu", "ATTENTION-GQA",
     {}, {"family": "attention", "main_loop": "wgmma"}, "sm_90a"),
    ("attention fused, wgmma split-KV decode (4096 keys in splits of 1024, the consumers' combine)",
     "decode_attention.habu", "DECODE-ATTENTION", {"J": 4096, "L": 4097},
     {"family": "attention", "main_loop": "wgmma", "bm": "64", "bn": "128", "stages": "3", "kv_split": "1024",
      "kv_warps": "1"}, "sm_90a"),
    ("wgmma cluster split-K (partials through DSMEM)", "ggemm.habu", "GGEMM", {"M": 100, "N": 300, "K": 1000},
     {"tile": "64x128x64", "stages": "4", "split_k": "4", "split_reduce": "cluster"}, "sm_90a"),
)
