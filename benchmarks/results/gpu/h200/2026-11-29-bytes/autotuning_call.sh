#!/bin/bash
# Issue 32, session 21, call 5, at e5c5f75: `pcp cache show` after a `pcp train` with an
# `xla` worker lists XLA's autotuning results (jax 0.11 keeps them a folder a device kind
# below their own; call 4), and `pcp cache clear` removes them with the rest.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false PCP_CACHE_DIR=/tmp/cache_train
call_log autotuning_log.txt
timeout 150 python3 -m pcp_core --log-format console train --algorithm diloco \
    --backend xla --worker-backends xla --model-size gpt2-small --precision bf16 \
    --steps 20 --inner-steps 10 --batch-size 16 --no-dashboard --out /tmp/run1 > /tmp/run1.txt 2>&1
stage train $?
grep -h "program ready" /tmp/run1/worker-0.log >> $log
python3 -m pcp_core cache show >> $log 2>&1
python3 -m pcp_core cache clear >> $log 2>&1
python3 -m pcp_core cache show >> $log 2>&1
echo "files left: $(find $PCP_CACHE_DIR -type f | wc -l)" >> $log
