#!/bin/bash
mkdir -p /tmp/site && tar xJf .device-site/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH RAY_AUTH_MODE=disabled
step() { local name=$1 t=$2; shift 2; echo "=== $name $(date +%T)"; timeout $t "$@" > $OUT/$name.log 2>&1; echo "rc=$? $(date +%T)"; tail -${TAILN:-25} $OUT/$name.log; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv
step pair_gpu 150 python -m pytest -x -q tests/gpu/test_grouped_wgmma.py -k "small_moe_ffn"
step moe1 200 python -m habu.bench.moe_speed --tokens 4096 --models mixtral --habu-max-rows 10000000 --profile --reps 10 --alt-pin pair_wgmmas=1
step moe2 200 python -m habu.bench.moe_speed --tokens 4096 --models mixtral --habu-max-rows 10000000 --profile --reps 10 --alt-pin pair_wgmmas=1 --alt-pin store_vector=8
