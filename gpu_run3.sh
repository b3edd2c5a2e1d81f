#!/bin/bash
# session 27, GPU run 3 (final): every new path's exact checks, then the speed figures
mkdir -p /tmp/site && tar xJf .device-site/site.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH RAY_AUTH_MODE=disabled
T0=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - T0) )); }
step() { local t=$1; shift; local l=$(left); [ $l -lt 15 ] && { echo "SKIPPED (no time): $*"; return; }
  [ $t -gt $l ] && t=$l; echo "=== [$(( $(date +%s) - T0 )) s] $*"; timeout $t "$@" > /tmp/step.txt 2>&1; cat /tmp/step.txt >> $OUT/log.txt; tail -${TAILN:-30} /tmp/step.txt; }
TAILN=12 step 210 python -m pytest -q -p no:cacheprovider -m gpu --maxfail=6 \
  tests/gpu/test_batched.py tests/gpu/test_graph_capture.py tests/gpu/test_skinny.py tests/gpu/test_columns.py \
  tests/gpu/test_grouped.py tests/gpu/test_moe.py tests/gpu/test_buckets.py \
  "tests/gpu/test_sanitize_paths.py::test_no_sanitizer_errors" -k "not sanitizer or wgmma-tma-store-f32 or fma or rows-max"
TAILN=12 step 100 python -m pytest -q -p no:cacheprovider -m gpu --maxfail=6 tests/gpu/test_training.py \
  tests/gpu/test_general.py tests/gpu/test_golden.py -k "training or rows_ or columns_ or col_max or ffn_skip or rmsnorm_linear or b_contiguous"
TAILN=30 step 150 python -m habu.bench.decode_speed --json $OUT/decode.json
TAILN=22 step 100 python -m habu.bench.bmm_speed --json $OUT/bmm.json
TAILN=9 step 30 python -m habu.bench.call_overhead --calls 1000 --repeats 5 --json $OUT/call_overhead.json
TAILN=8 step 45 python -m habu.bench.backward_speed --json $OUT/backward.json
TAILN=20 step 45 python -m habu.bench.moe_speed --models qwen3,mixtral --tokens 16,128 --json $OUT/moe.json
TAILN=15 step 60 python -m habu.bench.general_vs_specialised --json $OUT/gvs.json
echo "total $(( $(date +%s) - T0 )) s"
