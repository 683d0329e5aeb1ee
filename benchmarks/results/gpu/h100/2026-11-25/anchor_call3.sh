#!/bin/bash
# Issue 32, part 2, third device call (run from the repository root on the H100 machine;
# structlog, platformdirs and tomli_w copied from the venv into .whl/site, carried).
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/call3_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
# 1. batch 16: the anchor, the second call's best (product-output) and GELU recomputed on top
timeout 150 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla product-output pcp \
    --profile --hlo-dir /tmp/hlo --results $OUT --stem anchor3_b16 >> $log 2>&1
stage b16 $?
# 2. batch 8
timeout 80 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 8 --precision bf16 \
    --torch compiled --xla pcp --results $OUT --stem anchor3_b8 >> $log 2>&1
stage b8 $?
# 3. the xla tests with the defaults as they are now
timeout 90 python3 -m pytest -p no:cacheprovider -p pytest_xla_options \
    plugins/pcp-xla/tests/test_conformance.py plugins/pcp-xla/tests/test_runtime.py \
    plugins/pcp-xla/tests/test_platform_forms.py > $OUT/pytest_xla_gpu_defaults3.log 2>&1
stage pytest $?
# 4. batch 24 (the best batch of the last two calls)
timeout $((300 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 24 --precision bf16 --torch compiled --xla pcp --results $OUT --stem anchor3_b24 >> $log 2>&1
stage b24 $?
rm -f $OUT/*.md
tar -czf $OUT/hlo3_b16.tgz -C /tmp hlo/pcp_b16.hlo.txt
