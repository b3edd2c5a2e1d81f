#!/usr/bin/env bash
# rows2 (session 32): one row kernel stores RMSNorm's rstd R1[r] and Y[r d] (the forward with the values its
# backward saves). Run from the repo root on the device machine; outputs under $OUT/rows2/.
set -u
mkdir -p "$OUT/rows2"
echo "== GPU tests: golden per bucket, cluster row, RMSNORM-LINEAR forward, bitwise vs the split plan, SOFTMAX-NODES"
timeout 90 python -m pytest -q -p no:cacheprovider tests/gpu/test_forward_saved_gpu.py 2>&1 | tail -20
echo "== habu.build(grad=True) of RMSNORM-ROWS (its forward is now the fused kernel)"
timeout 45 python -m pytest -q -p no:cacheprovider tests/gpu/test_torch_grad_gpu.py -k rmsnorm 2>&1 | tail -8
echo "== RMSNorm forward + rstd, 8192 x 4096 and 8192 x 16384: fused vs split, Liger-style torch, torch.compile, copy"
timeout 100 python -m habu.bench.forward_saved_speed --rows 8192 --widths 4096,16384 \
    --json "$OUT/rows2/forward_saved_speed.json" 2>&1 | grep -v "^W[0-9]" | tail -12
