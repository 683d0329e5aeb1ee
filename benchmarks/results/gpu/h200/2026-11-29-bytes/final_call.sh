#!/bin/bash
# Issue 32, session 21, call 6, at 50a86ec (the compile cache after its second review):
# pcp-xla's tests on the GPU (test_heterogeneous needs the IREE compiler, which this
# machine lacks), then `pcp cache show` over what they and one `pcp train` left.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false PCP_CACHE_DIR=/tmp/cache_final
call_log final_log.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider plugins/pcp-xla/tests \
    --deselect plugins/pcp-xla/tests/test_heterogeneous.py::test_xla_and_iree_workers_train_together >> $log 2>&1
stage "pcp-xla tests" $?
timeout 120 python3 -m pcp_core --log-format console train --algorithm diloco \
    --backend xla --worker-backends xla --model-size gpt2-small --precision bf16 \
    --steps 20 --inner-steps 10 --batch-size 16 --no-dashboard --out /tmp/run1 > /tmp/run1.txt 2>&1
stage train $?
grep -h "program ready" /tmp/run1/worker-0.log >> $log
python3 -m pcp_core cache show >> $log 2>&1
