#!/bin/bash
# Issue 32, session 20, call 2, before the sigmoid form was shipped: GELU as x·σ(2u)
# (`gelu-sigmoid`, now `pcp`) against the program as shipped then (now `gelu-tanh`) and
# torch.compile, in turns at 10 steps a call (batch 16, 30 calls; batch 32,
# 10), with the GPU's clock and power; then both programs' kernel tables at batch 16.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log sigmoid_log.txt
timeout 240 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 16 --steps-per-call 10 --calls 30 --interleave --torch compiled \
    --xla pcp gelu-sigmoid --peak-tflops 989 --power --results $OUT --stem sigmoid_b16 >> $log 2>&1
stage sigmoid_b16 $?
timeout 200 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 32 --steps-per-call 10 --calls 10 --interleave --torch compiled \
    --xla pcp gelu-sigmoid --peak-tflops 989 --power --results $OUT --stem sigmoid_b32 >> $log 2>&1
stage sigmoid_b32 $?
timeout 120 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 16 --calls 2 --torch --xla pcp gelu-sigmoid --profile \
    --results $OUT --stem profile_b16 >> $log 2>&1
stage profile_b16 $?
gzip $OUT/*_kernels.txt
rm -f $OUT/*.md
tar czf /tmp/sigmoid.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/sigmoid.tgz $OUT/
