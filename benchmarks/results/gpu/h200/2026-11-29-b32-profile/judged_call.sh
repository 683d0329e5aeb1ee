#!/bin/bash
# Issue 32, session 18, call 4: the positions' adds shipped (`pcp`) beside the reduction
# they replace (`position-reduced`) and torch.compile, at batches 8 to 32; then one
# profiled call at batch 24 with the first and last events of the call (the host's CUDA
# calls with the GPU's work), to see what the GPU waits for at a call's edges.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log judged_log.txt
timeout 380 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 8 16 24 32 --torch compiled --xla pcp position-reduced --peak-tflops 989 \
    --results $OUT --stem judged >> $log 2>&1
stage judged $?
timeout 120 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 24 --calls 2 --torch --xla pcp --profile --peak-tflops 989 \
    --results $OUT --stem edges_b24 >> $log 2>&1
stage edges_b24 $?
rm -f $OUT/*.md
gzip -f $OUT/*kernels*.txt 2>/dev/null
tar czf /tmp/judged.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/judged.tgz $OUT/
