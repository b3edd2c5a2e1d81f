#!/bin/bash
mkdir -p /tmp/site && tar xJf .device-site/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:$PWD:$PYTHONPATH RAY_AUTH_MODE=disabled
step() { local name=$1 t=$2; shift 2; echo "=== $name $(date +%T)"; timeout $t "$@" > $OUT/$name.log 2>&1; echo "rc=$? $(date +%T)"; tail -${TAILN:-25} $OUT/$name.log; }
TAILN=5 step ncu_pair 200 ncu --set full --import-source yes -k regex:habu_moe_ffn.*_k0 -c 1 -o $OUT/pair -f python -m habu.bench.moe_speed --tokens 4096 --models mixtral --habu-max-rows 10000000 --reps 1
TAILN=5 step ncu_dense 150 ncu --set full -k regex:habu_ -s 2 -c 1 -o $OUT/dense -f python s37_dense.py
for r in pair dense; do ncu --import $OUT/$r.ncu-rep --page details --csv > $OUT/$r.details.csv 2>/dev/null; done
ncu --import $OUT/pair.ncu-rep --page source --csv --print-source sass > $OUT/pair.sass.csv 2>/dev/null
TAILN=4 step golden_hm 120 python -m pytest -x -q tests/gpu/test_attention_wgmma.py -k head-major
TAILN=14 step short 200 python -m habu.bench.attention_speed --jobs 8 --only short-
TAILN=8 step late_wait 200 python -m habu.bench.attention_speed --jobs 8 --only m16k-full-1k-d64,m16k-full-4k-d64,m16k-full-16k-d64,m16k-full-4k-d128 --pins ";late_wait=1"
