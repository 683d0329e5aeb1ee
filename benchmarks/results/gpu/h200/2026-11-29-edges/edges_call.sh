#!/bin/bash
# Issue 32, session 19, call 1: where the GPU idles at a call's edges (jax's profiler over
# two PCP calls queued back to back, batch 16), then torch.compile beside PCP at 10 steps a
# call (`pcp train`'s default K) and at 4 (the anchor's default), batches 8 and 16.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log edges_log.txt
timeout 150 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 16 --calls 2 --xla pcp --host-trace --peak-tflops 989 \
    --results $OUT --stem trace_b16 >> $log 2>&1
stage trace_b16 $?
timeout 200 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 8 16 --steps-per-call 10 --torch compiled --xla pcp --peak-tflops 989 \
    --results $OUT --stem k10 >> $log 2>&1
stage k10 $?
timeout 180 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 8 16 --steps-per-call 4 --torch compiled --xla pcp --peak-tflops 989 \
    --results $OUT --stem k4 >> $log 2>&1
stage k4 $?
rm -f $OUT/*.md
tar czf /tmp/edges.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/edges.tgz $OUT/
