#!/bin/bash
# Issue 32, session 21, call 3, at the head with the compile cache's size limit and
# `pcp cache`: (a) batches 16 and 8 in turns with torch.compile at `pcp train`'s 10 steps a
# call, with the clock and power; (b) `pcp train` with an `xla` worker, then `pcp cache
# show` (the kinds a GPU run leaves) and the same run under a limit smaller than the cache;
# (c) pcp-xla's tests on the GPU (test_heterogeneous needs the IREE compiler, which this
# machine lacks).
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log head_log.txt
PCP_CACHE_DIR=/tmp/cache_anchor timeout 330 python3 benchmarks/torch_anchor.py \
    --size gpt2-small --precision bf16 --batch 16 8 --steps-per-call 10 --calls 20 \
    --interleave --torch compiled --xla pcp --peak-tflops 989 --power --results $OUT \
    --stem head_k10 >> $log 2>&1
stage turns $?
export PCP_CACHE_DIR=/tmp/cache_train
train() {  # run directory, then environment settings
  env "${@:2}" timeout 120 python3 -m pcp_core --log-format console train --algorithm diloco \
      --backend xla --worker-backends xla --model-size gpt2-small --precision bf16 \
      --steps 20 --inner-steps 10 --batch-size 16 --no-dashboard --out $1 > $1.txt 2>&1
  stage "train $1" $?
  grep -h "program ready" $1/worker-0.log >> $log
  grep -h "trimmed" $1.txt $1/worker-0.log >> $log
}
train /tmp/run1 PCP_CACHE_MAX_GB=10
python3 -m pcp_core cache show >> $log 2>&1
train /tmp/run2 PCP_CACHE_MAX_GB=0.001
python3 -m pcp_core cache show >> $log 2>&1
export PCP_CACHE_DIR=/tmp/cache_tests
timeout 240 python3 -m pytest -q -p no:cacheprovider plugins/pcp-xla/tests \
    --deselect plugins/pcp-xla/tests/test_heterogeneous.py::test_xla_and_iree_workers_train_together >> $log 2>&1
stage "pcp-xla tests" $?
rm -f $OUT/*.md
tar czf /tmp/head.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/head.tgz $OUT/
