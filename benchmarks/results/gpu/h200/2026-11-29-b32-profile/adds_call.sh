#!/bin/bash
# Issue 32, session 18, call 3: the positions' gradient summed over the batch by adds
# (`position-adds`), so that no reduction over the batch alone asks XLA for a batch-minor
# residual stream (call 2: all 554 f32[32,1024,768] turned {0,2,1} in layout assignment).
# Batches 32, 24 and 16 beside torch.compile, profiled, with the optimized HLO.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log adds_log.txt
timeout 560 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 32 24 16 --torch compiled --xla pcp position-adds --profile \
    --hlo-dir $OUT/hlo --peak-tflops 989 --results $OUT --stem adds >> $log 2>&1
stage adds $?
rm -f $OUT/*.md
gzip -f $OUT/*kernels*.txt $OUT/hlo/* 2>/dev/null
tar czf /tmp/adds.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/adds.tgz $OUT/
