#!/bin/bash
# Issue 32, session 20, call 3, with GELU as x·σ(2u) shipped: pcp-xla's tests on the GPU
# (the conformance suite and the per-platform forms against the portable program), then
# torch.compile and PCP in turns at 10 steps a call, batches 16 and 8, 20 calls each, with
# the GPU's clock and power.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log confirm_log.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider plugins/pcp-xla/tests >> $log 2>&1
stage xla_tests $?
timeout 300 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 16 8 --steps-per-call 10 --calls 20 --interleave --torch compiled --xla pcp \
    --peak-tflops 989 --power --results $OUT --stem confirm_k10 >> $log 2>&1
stage confirm_k10 $?
rm -f $OUT/*.md
tar czf /tmp/confirm.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/confirm.tgz $OUT/
