#!/bin/bash
# Issue 32, session 18, call 5: the same program queued by the host in other ways
# (torch_anchor's DISPATCH_VARIANTS: the losses' copy queued with the call; the batch in one
# transfer; the next call's batch put on the device while this one runs), beside
# torch.compile at batches 16 and 24, profiled with the call's first and last events.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log dispatch_log.txt
timeout 215 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 16 24 --torch compiled --xla pcp early-copy one-put prefetch --profile \
    --peak-tflops 989 --results $OUT --stem dispatch >> $log 2>&1
stage dispatch $?
rm -f $OUT/*.md
gzip -f $OUT/*kernels*.txt 2>/dev/null
tar czf /tmp/dispatch.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/dispatch.tgz $OUT/
