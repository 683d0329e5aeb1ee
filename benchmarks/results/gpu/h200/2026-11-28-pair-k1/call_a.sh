#!/bin/bash
# call A: the cpu worker's program (the StableHLO the shepherd would compile for it),
# compiled afterwards here, where the IREE compiler is; then seed 0, pair then alone.
set -u
source .device/pair3/env.sh
log=$OUT/call_a_log.txt
start=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c 'import jax; print("jax", jax.__version__, jax.devices())'; } >> $log 2>&1
timeout 240 python3 benchmarks/gpu_unequal.py dump --out /tmp/dump -- "${FLAGS[@]}" --round-budget auto >> $log 2>&1
echo "== dump rc=$? at $((SECONDS - start))s" >> $log
gzip -c /tmp/dump/program.mlir > $OUT/program.mlir.gz; cp /tmp/dump/program.json $OUT/
