#!/bin/bash
# Issue 32, 2026-11-28 (session 13), H200: the residual add and layer norm as one Pallas
# kernel (layers.add_norm) in the CUDA export, against XLA's two fusions
# (`unfused-add-norm`), beside torch.compile, at batches 16 and 8; first the bf16 forms
# test on the GPU (the kernel against the portable program). Run from the repository root,
# .device/anchor carried (wheels of structlog, platformdirs, tomli_w, pycapnp).
set -u
if [ -d .device/patch ]; then cp -r .device/patch/pcp_core .device/patch/benchmarks .device/patch/plugins .device/patch/tests . ; fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site:$PWD/benchmarks
start=$SECONDS
log=$OUT/addnorm_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider plugins/pcp-xla/tests/test_platform_forms.py \
    -k "roundings or one_kernel" >> $log 2>&1
stage forms_test $?
VARIANTS="pcp unfused-add-norm pcp"
timeout 250 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla $VARIANTS --profile --results $OUT --stem addnorm_b16 >> $log 2>&1
stage b16 $?
timeout $((560 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 8 --precision bf16 --torch compiled --xla $VARIANTS --results $OUT --stem addnorm_b8 >> $log 2>&1
stage b8 $?
rm -f $OUT/*.md
