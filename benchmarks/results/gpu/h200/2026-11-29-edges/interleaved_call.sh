#!/bin/bash
# Issue 32, session 19, call 4: torch.compile and PCP's xla taking turns call by call
# (torch_anchor.py --interleave), 10 timed calls each, at 4 steps a call (batches 8 to 32)
# and at 10 (`pcp train`'s default; batches 8 and 16).
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log interleaved_log.txt
timeout 330 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 8 16 24 32 --calls 10 --interleave --torch compiled --xla pcp --peak-tflops 989 \
    --results $OUT --stem interleaved_k4 >> $log 2>&1
stage interleaved_k4 $?
timeout 200 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 8 16 --steps-per-call 10 --calls 10 --interleave --torch compiled --xla pcp \
    --peak-tflops 989 --results $OUT --stem interleaved_k10 >> $log 2>&1
stage interleaved_k10 $?
rm -f $OUT/*.md
tar czf /tmp/interleaved.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/interleaved.tgz $OUT/
