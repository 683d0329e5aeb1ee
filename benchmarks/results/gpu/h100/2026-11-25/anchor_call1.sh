#!/bin/bash
# Issue 32, part 2, first device call (run from the repository root on the H100 machine;
# structlog, platformdirs and tomli_w copied from the venv into .whl/site, carried).
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:$PWD/benchmarks
start=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } > $OUT/machine.txt 2>&1
# 1. batch 16: the anchor and the variants, kernel tables and optimized HLO
timeout 260 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla exact-precision exact-precision-bf16-hidden exact-hidden-cublas \
    exact-hidden-unrolled exact-hidden-graphs --profile --hlo-dir $OUT/hlo \
    --results $OUT --stem anchor_b16 > $OUT/anchor_b16_log.txt 2>&1
echo "rc=$? at $((SECONDS-start))s" >> $OUT/anchor_b16_log.txt
# 2. the xla tests with exact precision on
PCP_XLA_CUDA_OPTIONS='{"xla_allow_excess_precision": false}' timeout 150 python3 -m pytest \
    -p no:cacheprovider -p pytest_xla_options plugins/pcp-xla/tests/test_conformance.py \
    plugins/pcp-xla/tests/test_runtime.py plugins/pcp-xla/tests/test_platform_forms.py \
    > $OUT/pytest_xla_gpu_exact.log 2>&1
echo "rc=$? at $((SECONDS-start))s" >> $OUT/pytest_xla_gpu_exact.log
# 3. the batch sweep, torch compiled and exact precision + bf16 hidden
timeout $((585 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 8 24 32 48 --precision bf16 --torch compiled --xla exact-precision-bf16-hidden \
    --results $OUT --stem anchor_sweep > $OUT/anchor_sweep_log.txt 2>&1
echo "rc=$? at $((SECONDS-start))s" >> $OUT/anchor_sweep_log.txt
gzip -q $OUT/hlo/*.txt
