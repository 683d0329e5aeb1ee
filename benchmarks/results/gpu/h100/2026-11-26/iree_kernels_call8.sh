#!/bin/bash
# Issue 32, part 3 started, 2026-11-26, eighth device call, on an H100: where IREE cuda's
# GPT-2 small bf16 step goes, kernel by kernel (Nsight Compute). Run from the repository root
# on the machine (a git archive of HEAD); carried: .whl (structlog, platformdirs, tomli_w in
# .whl/site) and .device/rt (the iree-base-runtime 3.13.0 wheel for cp312, and the K=1 module
# compiled here for sm_80 by IREE 3.13.0: gpt2-small-bf16-k1-cuda.vmfb).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site:$PWD/benchmarks
export PYTHONUNBUFFERED=1 JAX_PLATFORMS=cpu
start=$SECONDS
log=$OUT/call8_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
run="benchmarks/kernel_profile.py run --vmfb-dir .device/rt/vmfb --size gpt2-small --precision bf16"
# 1. once without the profiler: the driver compiles the sm_80 PTX for Hopper and caches it
timeout 240 python3 $run >> $log 2>&1
stage warm $?
# 2. under ncu, each kernel's time
timeout $((540 - (SECONDS - start))) ncu --clock-control none --metrics gpu__time_duration.sum \
    --csv --print-units base --log-file $OUT/iree_gpt2_small_bf16_kernels.csv python3 $run >> $log 2>&1
stage ncu $?
python3 benchmarks/kernel_profile.py table $OUT/iree_gpt2_small_bf16_kernels.csv --top 30 \
    --out $OUT/iree_gpt2_small_bf16_kernels.md >> $log 2>&1
stage table $?
gzip -q $OUT/iree_gpt2_small_bf16_kernels.csv
