#!/bin/bash
# Issue 32, part 2, 2026-11-26, third device call, on an H100 (run from the repository root
# on the machine, a git archive of HEAD plus this work's files; structlog, platformdirs and
# tomli_w copied from the venv into .whl/site, carried). "pcp" is now the CUDA export with
# the roundings, layer norm's statistics kept and the residual gradient kept.
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/call3_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
# 1. batch 16, profiled
timeout 150 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla 2026-11-25 pcp --profile --results $OUT --stem anchor3_b16 >> $log 2>&1
stage b16 $?
# 2. batch 8 and 24
timeout 200 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 8 24 --precision bf16 \
    --torch compiled --xla 2026-11-25 pcp --results $OUT --stem anchor3_b8_b24 >> $log 2>&1
stage b8_b24 $?
# 3. the xla tests with the defaults as they are now
timeout 120 python3 -m pytest -p no:cacheprovider -p pytest_xla_options \
    plugins/pcp-xla/tests/test_conformance.py plugins/pcp-xla/tests/test_runtime.py \
    plugins/pcp-xla/tests/test_platform_forms.py > $OUT/pytest_xla_gpu_call3.log 2>&1
stage pytest $?
# 4. larger batches (48 did not fit PCP on 2026-11-25)
timeout $((570 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 32 48 --precision bf16 --torch compiled --xla pcp --results $OUT --stem anchor3_sweep >> $log 2>&1
stage sweep $?
rm -f $OUT/*.md
