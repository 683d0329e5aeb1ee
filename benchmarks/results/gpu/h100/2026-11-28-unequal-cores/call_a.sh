#!/bin/bash
# Issue 31 (CPU worker's cores), call A: the host's CPU topology, how many threads IREE's
# local-task driver starts on a given set of cores, and the cpu worker's program (the
# StableHLO the shepherd would compile for it), compiled afterwards where the IREE
# compiler is.
set -u
source .device/unequal2/env.sh
log=$OUT/call_a_log.txt
start=$SECONDS
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu
  for c in /sys/devices/system/cpu/cpu[0-9]*; do
    echo "$(basename $c) core $(cat $c/topology/core_id) siblings $(cat $c/topology/thread_siblings_list)"
  done
  for set in 8-15 12-15; do
    taskset -c $set python3 -c 'import glob, os, iree.runtime as rt
d = rt.get_device("local-task")
print("affinity", sorted(os.sched_getaffinity(0)), "threads",
      [(open(t + "/comm").read().strip(), open(t + "/status").read().split("Cpus_allowed_list:")[1].split()[0])
       for t in sorted(glob.glob("/proc/self/task/*")) if "iree" in open(t + "/comm").read()])'
  done
  python3 -c 'import jax; print("jax", jax.__version__, jax.devices())'; } >> $log 2>&1
timeout 240 python3 benchmarks/gpu_unequal.py dump --out /tmp/dump -- "${FLAGS[@]}" --round-budget auto ${EXTRA:-} >> $log 2>&1
stage dump $?
gzip -c /tmp/dump/program.mlir > $OUT/program.mlir.gz; cp /tmp/dump/program.json $OUT/
