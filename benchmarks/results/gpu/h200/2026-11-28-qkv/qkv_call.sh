#!/bin/bash
# Issue 32, 2026-11-28 (session 14), H200: q, k, v made by three products for cuDNN
# (nanogpt.SEPARATE_QKV_PLATFORMS, layers.attention_inputs) against one product split by a
# pass (`joint-qkv`), and their gradients through three products apart (`qkv-apart`),
# beside torch.compile, at batches 16 and 8; first the bf16 forms tests and the gradient
# test on the GPU. Apply separate_qkv.patch (git apply) first. Run from the repository
# root, .device/anchor carried (wheels of structlog, platformdirs, tomli_w, pycapnp).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/qkv_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
timeout 200 python3 -m pytest -q -p no:cacheprovider plugins/pcp-xla/tests/test_platform_forms.py \
    tests/test_nanogpt_gradients.py -k "bf16_forms or roundings or separate_qkv" >> $log 2>&1
stage forms_test $?
VARIANTS="pcp joint-qkv qkv-apart pcp"
timeout 250 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla $VARIANTS --profile --results $OUT --stem qkv_b16 >> $log 2>&1
stage b16 $?
timeout $((570 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 8 --precision bf16 --torch compiled --xla $VARIANTS --results $OUT --stem qkv_b8 >> $log 2>&1
stage b8 $?
rm -f $OUT/*.md
