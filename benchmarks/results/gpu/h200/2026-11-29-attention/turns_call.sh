#!/bin/bash
# Issue 32, session 22, call 4: the whole square, 512 and 256 queries a block, in turns
# (twice each), GPT-2 small bf16 at batch 8, IREE cuda and jax.jit side by side: calls 2
# and 3 put 512 ahead and 256 behind by 3-4%, within twice the spread between calls.
# Carried: .device/anchor, .device/iree, .device/attn.
set -u
source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/iree/*.whl
export XLA_PYTHON_CLIENT_PREALLOCATE=false PCP_CACHE_DIR=$(mktemp -d)
call_log turns_log.txt
timeout 500 python3 benchmarks/attention_blocks.py --backend cuda --size gpt2-small \
    --precision bf16 --blocks 1024 512 256 1024 512 256 --vmfb-dir .device/attn \
    --results $OUT >> $log 2>&1
stage turns $?
tar czf /tmp/turns.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/turns.tgz $OUT/
