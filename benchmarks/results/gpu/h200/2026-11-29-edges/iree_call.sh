#!/bin/bash
# Issue 32, session 19, call 3: IREE cuda modules' load time from an empty CUDA JIT cache
# and from a filled one (benchmarks/cuda_jit_cache.py); IREE cuda against XLA on this
# H200 (step_time.py, modules compiled here by --compile-only, carried in .device/vmfb);
# the kernel tables of torch.compile and PCP's xla at batch 64, where PCP is 2% behind.
set -u
source scripts/device_env.sh
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .device/iree/*.whl
export XLA_PYTHON_CLIENT_PREALLOCATE=false PCP_CACHE_DIR=$(mktemp -d)
call_log iree_log.txt
v=.device/vmfb
JAX_PLATFORMS=cpu timeout 100 python3 benchmarks/cuda_jit_cache.py $v/gpt-b32-f32-k10-cuda.vmfb \
    $v/gpt-b32-bf16-k10-cuda.vmfb $v/gpt2-small-f32-k4-cuda.vmfb $v/gpt2-small-bf16-k4-cuda.vmfb \
    --out $OUT/jit_cache.md >> $log 2>&1
stage jit_cache $?
timeout 130 python3 benchmarks/step_time.py --backend cuda --vmfb-dir $v --sizes gpt-b32 \
    --precision f32 bf16 --results $OUT/step_time_b32 >> $log 2>&1
stage step_time_b32 $?
timeout 120 python3 benchmarks/step_time.py --backend cuda --vmfb-dir $v --sizes gpt2-small \
    --precision bf16 --results $OUT/step_time_gpt2 >> $log 2>&1
stage step_time_gpt2 $?
timeout 170 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 64 --calls 2 --torch compiled --xla pcp --profile --peak-tflops 989 \
    --results $OUT --stem profile_b64 >> $log 2>&1
stage profile_b64 $?
gzip -f $OUT/*kernels*.txt 2>/dev/null
tar czf /tmp/iree.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/iree.tgz $OUT/
