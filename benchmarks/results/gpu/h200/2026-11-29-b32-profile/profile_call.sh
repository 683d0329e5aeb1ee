#!/bin/bash
# Issue 32, session 18, call 1: what grows from batch 16 to 32. GPT-2 small bf16, 4 steps a
# call: torch.compile and PCP (as shipped) profiled at both batches (kernel tables with the
# idle report, PCP's optimized HLO); then, unprofiled at batch 32, PCP with every product on
# cuBLAS or cuBLASLt rather than XLA's Triton GEMMs.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log profile_log.txt
timeout 330 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 --batch 16 32 \
    --torch compiled --xla pcp --profile --hlo-dir $OUT/hlo --peak-tflops 989 \
    --results $OUT --stem profile >> $log 2>&1
stage profile $?
timeout 200 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 --batch 32 \
    --xla pcp cublas cublaslt --peak-tflops 989 --results $OUT --stem gemms_b32 >> $log 2>&1
stage gemms_b32 $?
rm -f $OUT/*.md
gzip -f $OUT/*kernels*.txt $OUT/hlo/* 2>/dev/null
tar czf /tmp/profile.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/profile.tgz $OUT/
