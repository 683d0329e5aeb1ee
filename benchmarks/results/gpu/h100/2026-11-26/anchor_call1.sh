#!/bin/bash
# Issue 32, part 2, 2026-11-26, first device call (run from the repository root on the H100
# machine, a git archive of HEAD plus this work's files; structlog, platformdirs and tomli_w
# copied from the venv into .whl/site, carried).
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/call1_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
# 1. batch 16: the anchor, yesterday's defaults, the new choices one at a time and together
timeout 330 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla 2026-11-25 norm-recomputed bf16-norm bf16-branch bf16-logits \
    norm-all norm-all-logits --profile --hlo-dir /tmp/hlo --results $OUT --stem anchor1_b16 >> $log 2>&1
stage b16 $?
# 2. batch 8
timeout 120 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 8 --precision bf16 \
    --torch compiled --xla 2026-11-25 norm-all norm-all-logits --results $OUT --stem anchor1_b8 >> $log 2>&1
stage b8 $?
# 3. the platform forms' tests on the GPU (the new roundings against the portable bf16 program)
timeout 100 python3 -m pytest -p no:cacheprovider -p pytest_xla_options \
    plugins/pcp-xla/tests/test_platform_forms.py > $OUT/pytest_forms_call1.log 2>&1
stage pytest $?
rm -f $OUT/*.md
tar -czf $OUT/hlo1_b16.tgz -C /tmp hlo/norm-all-logits_b16.hlo.txt hlo/norm-recomputed_b16.hlo.txt
