#!/bin/bash
# Issue 32, session 17, call 7: larger batches than 16 on the H200 (the program as shipped at
# 83fc1d4), GPT-2 small bf16 beside torch.compile: which batch gives PCP its best MFU here.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log batches_log.txt
timeout 185 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 --batch 24 32 \
    --torch compiled --xla pcp --peak-tflops 989 --results $OUT --stem batches >> $log 2>&1
stage batches $?
rm -f $OUT/*.md
tar czf /tmp/batches.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/batches.tgz $OUT/
