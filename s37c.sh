#!/bin/bash
mkdir -p /tmp/site && tar xJf .device-site/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH RAY_AUTH_MODE=disabled
step() { local name=$1 t=$2; shift 2; echo "=== $name $(date +%T)"; timeout $t "$@" > $OUT/$name.log 2>&1; echo "rc=$? $(date +%T)"; tail -${TAILN:-25} $OUT/$name.log; }
TAILN=4 step golden_hm 120 python -m pytest -x -q tests/gpu/test_attention_wgmma.py -k head-major
TAILN=14 step short 200 python -m habu.bench.attention_speed --jobs 8 --only short-
TAILN=8 step late_wait 200 python -m habu.bench.attention_speed --jobs 8 --only m16k-full-1k-d64,m16k-full-4k-d64,m16k-full-16k-d64,m16k-full-4k-d128 --pins ";late_wait=1"
