#!/bin/bash
# Issue 32, session 22, call 2: the portable attention in query blocks against the whole
# causal square, GPT-2 small bf16 at batch 8, IREE cuda and jax.jit side by side in one
# process (benchmarks/attention_blocks.py; modules compiled here into .device/attn by
#   python benchmarks/attention_blocks.py --backend cuda --target sm_80 --size gpt2-small \
#       --precision bf16 --blocks 1024 256 128 --vmfb-dir .device/attn --compile-only)
# then pcp-xla's tests on this machine's jax and GPU (test_heterogeneous needs the IREE
# compiler, which this machine lacks). Carried: .device/anchor, .device/iree, .device/attn.
set -u
source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/iree/*.whl
export XLA_PYTHON_CLIENT_PREALLOCATE=false PCP_CACHE_DIR=$(mktemp -d)
call_log blocks_log.txt
timeout 300 python3 benchmarks/attention_blocks.py --backend cuda --size gpt2-small \
    --precision bf16 --blocks 1024 256 128 --vmfb-dir .device/attn --results $OUT >> $log 2>&1
stage blocks $?
PCP_CACHE_DIR=/tmp/cache_tests timeout 200 python3 -m pytest -q -p no:cacheprovider \
    plugins/pcp-xla/tests \
    --deselect plugins/pcp-xla/tests/test_heterogeneous.py::test_xla_and_iree_workers_train_together \
    > $OUT/pytest_xla.log 2>&1
stage "pcp-xla tests" $?
tail -2 $OUT/pytest_xla.log >> $log
