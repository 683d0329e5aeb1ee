#!/bin/bash
# Call 2: the separate products with XLA's DotMerger off (`unmerged`), which in call 1
# joined them back into one product and sliced its output; batch 16 only, no torch
# (the device budget left); the same as qkv_call.sh otherwise. NOT RUN YET: the
# session's device time ran out before it (README.md).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site:$PWD/benchmarks
python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 --torch \
    --xla joint-qkv unmerged joint-qkv-unmerged pcp --results $OUT --stem qkv2_b16 > $OUT/qkv2_log.txt 2>&1
echo "rc=$?" >> $OUT/qkv2_log.txt
rm -f $OUT/*.md
