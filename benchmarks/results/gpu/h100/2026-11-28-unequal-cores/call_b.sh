#!/bin/bash
# Issue 31 (CPU worker's cores), call B: the GPU worker beside an IREE cpu worker on
# CPU_CORES cores (its program from the carried compile cache, compiled from call A's
# dump), then the GPU worker alone (RUNS); rounds by time (auto), overlapped, merged by
# tokens, H = 500, --steps 10000. Every 30 s, each process's threads and CPU share (ps).
set -u
source .device/unequal2/env.sh
log=$OUT/call_b_log.txt
start=$SECONDS
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
( while sleep 30; do
    echo "-- $((SECONDS - start)) s"
    ps -eo pid,psr,nlwp,pcpu,etimes,args --sort=args | grep '[p]cp_core' | cut -c1-160
    for p in $(pgrep -f 'state-dir /tmp/gu/pair/cpu/state'); do
      grep -H Cpus_allowed_list /proc/$p/task/*/status | sed 's#/proc/##' | tr '\n' ' '; echo
    done
  done ) > $OUT/ps.txt 2>&1 &
monitor=$!
timeout $((590 - (SECONDS - start))) python3 benchmarks/gpu_unequal.py run \
    --runs ${RUNS:-pair alone} --cpu-cores ${CPU_CORES:-4} --cache ../cache --out /tmp/gu \
    --results $OUT --stem ${STEM:-cores} --timeout ${RUN_TIMEOUT:-450} -- "${FLAGS[@]}" \
    --round-budget auto ${EXTRA:-} >> $log 2>&1
stage run $?
kill $monitor
for run in alone pair; do
  cp /tmp/gu/$run/shepherd/metrics.jsonl $OUT/${run}_metrics.jsonl 2>/dev/null
done
(cd /tmp/gu && tar czf $OUT/logs.tgz */*.log) 2>> $log
grep -h '"joined"\|error\|Error' /tmp/gu/*/*.log | cut -c1-300 >> $log 2>&1
