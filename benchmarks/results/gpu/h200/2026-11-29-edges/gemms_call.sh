#!/bin/bash
# Issue 32, session 19, call 6: at the power cap, does the GEMMs' source change what a
# step costs? torch.compile (cuBLAS's nvjet kernels), PCP as shipped (XLA's Triton GEMMs
# where its autotuner picks them) and PCP with every product through cuBLAS, taking turns
# call by call, 10 steps a call, batches 16 and 32.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log gemms_log.txt
timeout 320 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 16 32 --steps-per-call 10 --calls 8 --interleave --torch compiled \
    --xla pcp cublas --peak-tflops 989 --results $OUT --stem gemms >> $log 2>&1
stage gemms $?
rm -f $OUT/*.md
