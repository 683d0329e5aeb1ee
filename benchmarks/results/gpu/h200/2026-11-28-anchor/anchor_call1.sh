#!/bin/bash
# Issue 32, 2026-11-28, first device call (H200): XLA's fusion options that may write layer
# norm as one kernel, on top of the CUDA export as shipped, beside torch.compile, at
# batches 16 and 8. Run from the repository root on the machine, .device/anchor carried
# (the wheels of structlog, platformdirs, tomli_w and pycapnp).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/call1_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
# The call also ran triton-softmax and triton-multi-output (the option
# xla_gpu_experimental_enable_triton_softmax_priority_fusion, alone and with Triton's
# multi-output fusions); jax 0.11.2's XLA has no such option, and they are gone.
VARIANTS="pcp heroless block-level cudnn-norm fusion-autotuner"
timeout 280 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla $VARIANTS --profile --results $OUT --stem anchor1_b16 >> $log 2>&1
stage b16 $?
timeout $((570 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 8 --precision bf16 --torch compiled --xla $VARIANTS --results $OUT --stem anchor1_b8 >> $log 2>&1
stage b8 $?
rm -f $OUT/*.md
