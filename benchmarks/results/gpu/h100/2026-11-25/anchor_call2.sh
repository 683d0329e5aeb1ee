#!/bin/bash
# Issue 32, part 2, second device call (run from the repository root on the H100 machine;
# structlog, platformdirs and tomli_w copied from the venv into .whl/site, carried).
# The variant product-output-stacked (q, k, v by layers.split_qkv) and the bias sum behind a
# barrier (in "pcp" then) were dropped from the code after this call (torch_anchor.md).
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/call2_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
# 1. batch 16: the anchor, the last call's best and the new choices one by one; profiled
timeout 210 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla exact-precision-bf16-hidden product-output product-output-stacked pcp \
    --profile --hlo-dir /tmp/hlo --results $OUT --stem anchor2_b16 >> $log 2>&1
stage b16 $?
# 2. batch 8
timeout 120 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 8 --precision bf16 \
    --torch compiled --xla exact-precision-bf16-hidden pcp --results $OUT --stem anchor2_b8 >> $log 2>&1
stage b8 $?
# 3. the xla tests with the defaults as they are now
timeout 150 python3 -m pytest -p no:cacheprovider -p pytest_xla_options \
    plugins/pcp-xla/tests/test_conformance.py plugins/pcp-xla/tests/test_runtime.py \
    plugins/pcp-xla/tests/test_platform_forms.py > $OUT/pytest_xla_gpu_defaults.log 2>&1
stage pytest $?
# 4. larger batches
timeout 140 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 24 32 --precision bf16 \
    --torch compiled --xla pcp --results $OUT --stem anchor2_sweep >> $log 2>&1
stage sweep $?
timeout $((580 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 48 --precision bf16 --torch --xla pcp --results /tmp/b48 --stem b48 >> $log 2>&1
stage b48 $?
rm -f $OUT/*.md
tar -czf $OUT/hlo_b16.tgz -C /tmp hlo
