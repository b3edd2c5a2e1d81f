#!/usr/bin/env bash
# Session 32, multiout: a contraction epilogue that stores two outputs of its chain (S1 and S3 of FFN-SKIP's
# forward with saved values, one kernel instead of the GEMM plus a 103.7 µs rows kernel at 4096 tokens).
# 1. the exact and golden GPU tests of the new epilogue (every contraction path), and the FFN-SKIP
#    forward/backward through habu.build(grad=True); 2. the step at 4096 tokens with each kernel timed alone
#    (the forward's k0 should now be S1 %2 S3, and the rows kernel %2 S3 gone).
set -u
mkdir -p "$OUT/multiout"
timeout 100 python -m pytest -q -p no:cacheprovider tests/gpu/test_multi_output_gpu.py tests/gpu/test_torch_grad_gpu.py -k "not rmsnorm and not softmax" 2>&1 | tail -25
timeout 140 python -m habu.bench.train_step_profile --tokens 4096 --json "$OUT/multiout/profile_4096.json" 2>&1 | tail -45
