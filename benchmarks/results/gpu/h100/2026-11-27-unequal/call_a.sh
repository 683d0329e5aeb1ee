#!/bin/bash
# Issue 31 on the GPU machine, call A: the cpu worker's program (the StableHLO the
# shepherd would compile for it), compiled afterwards where the IREE compiler is.
set -u
source .device/unequal/env.sh
log=$OUT/call_a_log.txt
start=$SECONDS
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
python3 -c 'import jax; print("jax", jax.__version__, jax.devices())' >> $log 2>&1
timeout 240 python3 benchmarks/gpu_unequal.py dump --out /tmp/dump -- "${FLAGS[@]}" --round-budget auto ${EXTRA:-} >> $log 2>&1
stage dump $?
gzip -c /tmp/dump/program.mlir > $OUT/program.mlir.gz; cp /tmp/dump/program.json $OUT/
