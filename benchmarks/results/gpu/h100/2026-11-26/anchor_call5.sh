#!/bin/bash
# Issue 32, part 2, 2026-11-26, fifth device call, on an H100 (run from the repository root
# on the machine, a git archive of HEAD plus this work's files; structlog, platformdirs and
# tomli_w copied from the venv into .whl/site, carried). one-pass-dense-gelu was the CUDA default
# in this call's tree; on top of it: layer norm's two gradient sums in one (`one-sum`, made the
# default after this call, 7f05601), the log-sum-exp in blocks of 128 (`blocked`, dropped).
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/call5_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
ways="one-pass-dense-gelu one-sum blocked one-sum-blocked"
# 1. batch 16, profiled
timeout 200 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla $ways --profile --hlo-dir /tmp/hlo --results $OUT --stem anchor5_b16 >> $log 2>&1
stage b16 $?
# 2. batch 8
timeout 130 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 8 --precision bf16 \
    --torch compiled --xla $ways --results $OUT --stem anchor5_b8 >> $log 2>&1
stage b8 $?
# 3. the platform forms' tests on the GPU
timeout 100 python3 -m pytest -p no:cacheprovider -p pytest_xla_options \
    plugins/pcp-xla/tests/test_platform_forms.py > $OUT/pytest_forms_call5.log 2>&1
stage pytest $?
rm -f $OUT/*.md
tar -czf $OUT/hlo5_b16.tgz -C /tmp hlo/one-sum-blocked_b16.hlo.txt
