#!/bin/bash
# Issue 32, session 20, call 1: torch.compile and PCP's xla taking turns call by call at
# `pcp train`'s 10 steps a call, 40 timed calls each, with nvidia-smi sampling the SM clock
# and power (--power, its first run on a GPU); then PCP's optimized HLO at batches 16 and
# 64, to name the fusions of the kernel tables.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log turns_log.txt
timeout 330 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 16 8 --steps-per-call 10 --calls 40 --interleave --torch compiled --xla pcp \
    --peak-tflops 989 --power --results $OUT --stem turns_k10 >> $log 2>&1
stage turns_k10 $?
timeout 150 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 16 64 --calls 1 --torch --xla pcp --hlo-dir /tmp/hlo \
    --results /tmp --stem hlo >> $log 2>&1
stage hlo $?
tar czf $OUT/hlo.tgz -C /tmp/hlo .
rm -f $OUT/*.md
tar czf /tmp/power.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/power.tgz $OUT/
