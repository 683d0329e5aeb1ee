#!/bin/bash
# Issue 32, part 2, 2026-11-26, second device call (run from the repository root on the H100
# machine, a git archive of HEAD plus this work's files; structlog, platformdirs and tomli_w
# copied from the venv into .whl/site, carried). The first call's `norm-recomputed` (x behind
# a barrier, the statistics recomputed) was replaced by `norm_statistics` before this call.
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/call2_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
ways="2026-11-25 rounded rounded-statistics rounded-gradient rounded-statistics-gradient"
# 1. batch 16, profiled
timeout 240 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla $ways --profile --hlo-dir /tmp/hlo --results $OUT --stem anchor2_b16 >> $log 2>&1
stage b16 $?
# 2. batch 8
timeout 150 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 8 --precision bf16 \
    --torch compiled --xla $ways --results $OUT --stem anchor2_b8 >> $log 2>&1
stage b8 $?
# 3. the platform forms' tests on the GPU
timeout 100 python3 -m pytest -p no:cacheprovider -p pytest_xla_options \
    plugins/pcp-xla/tests/test_platform_forms.py > $OUT/pytest_forms_call2.log 2>&1
stage pytest $?
# 4. batch 24
timeout $((560 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 24 --precision bf16 --torch compiled --xla 2026-11-25 rounded-statistics-gradient \
    --results $OUT --stem anchor2_b24 >> $log 2>&1
stage b24 $?
rm -f $OUT/*.md
tar -czf $OUT/hlo2_b16.tgz -C /tmp hlo/rounded-statistics-gradient_b16.hlo.txt hlo/rounded_b16.hlo.txt
