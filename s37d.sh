#!/bin/bash
mkdir -p /tmp/site && tar xJf .device-site/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH RAY_AUTH_MODE=disabled
step() { local name=$1 t=$2; shift 2; echo "=== $name $(date +%T)"; timeout $t "$@" > $OUT/$name.log 2>&1; echo "rc=$? $(date +%T)"; tail -${TAILN:-25} $OUT/$name.log; }
TAILN=6 step attn_gpu 150 python -m pytest -x -q tests/gpu/test_attention.py -k "odd_sizes"
TAILN=6 step moe_gpu 120 python -m pytest -x -q tests/gpu/test_grouped_wgmma.py tests/gpu/test_grouped_pair.py -k "moe or pair"
TAILN=12 step short 120 python -m habu.bench.attention_speed --jobs 8 --only short-
TAILN=40 step moe 150 python -m habu.bench.moe_speed --tokens 4096 --models mixtral --habu-max-rows 10000000 --profile --reps 10 --alt-pin pair_wgmmas=1 --alt-pin store_vector=8
