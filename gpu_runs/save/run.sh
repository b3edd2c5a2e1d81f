#!/usr/bin/env bash
# Session 32 `save` (issue 21, the FFN-SKIP training step): AUTO saves the GELU output (a contraction operand
# the forward stores anyway) and the backward computes T2 = S1 + B1 inside the GELU-derivative epilogue
# (epilogue:%2): the backward went from 11 kernels to 9. Run from the repo root; writes $OUT/save/.
set -u
mkdir -p "$OUT/save"
echo "== GPU tests (training, backward golden incl. FFN-SKIP's new default, torch grad) $(date -u +%T)"
timeout 170 python -m pytest -q tests/gpu/test_training.py tests/gpu/test_backward_gpu.py \
  tests/gpu/test_torch_grad_gpu.py 2>&1 | tail -5
echo "== train step, 4096 tokens, and its kernels one by one (one build) $(date -u +%T)"
timeout 200 python gpu_runs/save/step_profile.py --tokens 4096 --json "$OUT/save/step_4096.json" 2>&1 | tail -40
echo "== train step, 128 tokens $(date -u +%T)"
timeout 90 python -m habu.bench.train_step_speed --tokens 128 --json "$OUT/save/step_128.json" 2>&1 | tail -4
echo "== done $(date -u +%T)"
