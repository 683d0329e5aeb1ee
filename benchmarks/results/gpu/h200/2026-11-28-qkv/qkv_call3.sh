#!/bin/bash
# Call 3 (session 15): three products with XLA's DotMerger off (`unmerged`) against the
# shipped joint form with and without it, beside torch.compile, batches 16 and 8,
# each PCP form twice (first and last) for the spread. Apply separate_qkv.patch first.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/qkv3_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
VARIANTS="joint-qkv unmerged joint-qkv-unmerged unmerged joint-qkv"
timeout 300 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla $VARIANTS --results $OUT --stem qkv3_b16 >> $log 2>&1
stage b16 $?
timeout $((580 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 8 --precision bf16 --torch compiled --xla $VARIANTS --results $OUT --stem qkv3_b8 >> $log 2>&1
stage b8 $?
rm -f $OUT/*.md
