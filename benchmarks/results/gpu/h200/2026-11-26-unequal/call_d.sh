#!/bin/bash
# Issue 31 on the GPU machine, call D: the GPU worker alone and beside a cpu worker
# (IREE; its program from the carried compile cache, compiled from call C's dump), and
# beside an xla worker on the CPU; rounds by time (auto), overlapped, merged by tokens.
set -u
source .device/unequal/env.sh
log=$OUT/call_d_log.txt
start=$SECONDS
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
timeout $((590 - (SECONDS - start))) python3 benchmarks/gpu_unequal.py run \
    --runs ${RUNS:-alone pair pair-xla} --cache .device/unequal/cache --out /tmp/gu \
    --results $OUT --stem ${STEM:-gpu_cpu_auto} --timeout 250 -- "${FLAGS[@]}" \
    --round-budget auto >> $log 2>&1
stage run $?
for run in alone pair pair-xla; do
  cp /tmp/gu/$run/shepherd/metrics.jsonl $OUT/${run}_metrics.jsonl 2>/dev/null
done
grep -h '"joined"\|error\|Error' /tmp/gu/*/*.log | cut -c1-300 >> $log 2>&1
