#!/bin/bash
# Issue 32, session 19, call 2: an IREE cuda worker's module load, first and second time,
# under CUDA's JIT cache defaults and under PCP's (benchmarks/cuda_jit_cache.py; the
# modules compiled here by step_time.py --compile-only, carried in .device/vmfb); then
# torch.compile beside PCP's xla at batches 32, 48 and 64, for the best batch's MFU.
set -u
source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/iree/*.whl
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log jit_log.txt
JAX_PLATFORMS=cpu timeout 330 python3 benchmarks/cuda_jit_cache.py \
    .device/vmfb/gpt-b32-bf16-k10-cuda.vmfb --out $OUT/jit_cache.md >> $log 2>&1
stage jit_cache $?
timeout 240 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 32 48 64 --calls 4 --torch compiled --xla pcp --peak-tflops 989 \
    --results $OUT --stem large >> $log 2>&1
stage large $?
rm -f $OUT/large.md
tar czf /tmp/jit.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/jit.tgz $OUT/
