#!/bin/bash
# Issue 32, part 2, 2026-11-26, seventh device call, on an H100 (run from the repository root
# on the machine, a git archive of HEAD plus this work's files; structlog, platformdirs and
# tomli_w copied from the venv into .whl/site, carried). one-sum is the CUDA default of
# 7f05601; on top of it: q, k, v by three products with the bias inside (`qkv-products`,
# layers.qkv_products; slower, dropped from the code after this call).
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/call7_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
# 1. batch 16, profiled
timeout 150 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla one-sum qkv-products --profile --results $OUT --stem anchor7_b16 >> $log 2>&1
stage b16 $?
# 2. batch 8
timeout 100 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 8 --precision bf16 \
    --torch compiled --xla one-sum qkv-products --results $OUT --stem anchor7_b8 >> $log 2>&1
stage b8 $?
# 3. the platform forms' tests on the GPU
timeout 100 python3 -m pytest -p no:cacheprovider -p pytest_xla_options \
    plugins/pcp-xla/tests/test_platform_forms.py > $OUT/pytest_forms_call7.log 2>&1
stage pytest $?
rm -f $OUT/*.md
