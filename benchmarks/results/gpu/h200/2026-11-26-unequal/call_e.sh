#!/bin/bash
# Issue 31 on the GPU machine, call E: the cpu worker's program for H = 500, 12 rounds
# (compiled afterwards where the IREE compiler is), and the GPU worker alone (auto).
set -u
source .device/unequal/env.sh
log=$OUT/call_e_log.txt
start=$SECONDS
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
timeout 120 python3 benchmarks/gpu_unequal.py dump --out /tmp/dump -- "${FLAGS[@]}" --round-budget auto >> $log 2>&1
stage dump $?
gzip -c /tmp/dump/program.mlir > $OUT/program.mlir.gz; cp /tmp/dump/program.json $OUT/
timeout $((560 - (SECONDS - start))) python3 benchmarks/gpu_unequal.py run --runs alone \
    --out /tmp/gu --results $OUT --stem call_e --timeout 300 -- "${FLAGS[@]}" \
    --round-budget auto >> $log 2>&1
stage alone $?
cp /tmp/gu/alone/shepherd/metrics.jsonl $OUT/alone_metrics.jsonl
