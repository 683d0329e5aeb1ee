#!/bin/bash
# Issue 31 on the GPU machine, call B: the GPU worker alone, then beside an IREE cpu
# worker (its program from the carried compile cache, compiled from call A's dump);
# rounds by time (auto), overlapped, merged by tokens; 20 rounds of H = 500 (STEPS).
# The GPU machine took about 157 s from the start to the first round: one run a call.
set -u
source .device/unequal/env.sh
log=$OUT/call_b_log.txt
start=$SECONDS
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
timeout $((590 - (SECONDS - start))) python3 benchmarks/gpu_unequal.py run \
    --runs ${RUNS:-alone pair} --cache .device/unequal/cache --out /tmp/gu \
    --results $OUT --stem ${STEM:-gpu_cpu_auto_24rounds} --timeout ${RUN_TIMEOUT:-450} -- "${FLAGS[@]}" \
    --round-budget auto ${EXTRA:-} >> $log 2>&1
stage run $?
for run in alone pair; do
  cp /tmp/gu/$run/shepherd/metrics.jsonl $OUT/${run}_metrics.jsonl 2>/dev/null
  for f in /tmp/gu/$run/*.log; do [ -f "$f" ] && gzip -c "$f" > $OUT/${run}_$(basename $f).gz; done
done
grep -h '"joined"\|error\|Error' /tmp/gu/*/*.log | cut -c1-300 >> $log 2>&1
