#!/usr/bin/env bash
# Session 32 `persist` (issue 22): the persistent wgmma attention kernel (`--pin persistent=1`, not the default):
# one block an SM walking the work tiles heaviest first, the K/V ring and Q's single buffer handed on across tiles
# (the next tile's Q and K/V load while this tile's last P·V and epilogue run). Run from the repo root; writes
# $OUT/persist/. Every step has a timeout: a barrier bug hangs the kernel.
set -u
mkdir -p "$OUT/persist"
echo "== GPU tests: persistent golden (float64) at odd sizes, grids of 2-7 blocks, bitwise = the one-tile kernel $(date -u +%T)"
timeout 130 python -m pytest -q tests/gpu/test_attention_wgmma.py -k persistent 2>&1 | tail -15
echo "== attention_speed: 1k and 4k, persistent against the same plan without, and SDPA $(date -u +%T)"
timeout 140 python -m habu.bench.attention_speed --jobs 8 --json "$OUT/persist/speed.json" \
  --only fa3-causal-1k,fa3-causal-1k-persist,fa3-full-1k,fa3-full-1k-persist,fa3-causal-4k,fa3-causal-4k-persist \
  2>&1 | tail -20
echo "== compute-sanitizer memcheck and synccheck on a persistent case (160 work tiles) $(date -u +%T)"
timeout 80 python -m habu.bench.sanitize_paths --only attention-wgmma-persistent --tool memcheck --tool synccheck \
  2>&1 | tail -12
echo "== done $(date -u +%T)"
