#!/bin/bash
# Issue 32, session 16: layer norm's weight and bias folded into the product after it
# (nanogpt.NORM_FOLDED_PLATFORMS, shipped as `pcp`) against the export without the fold
# (`unfolded`), beside torch.compile, GPT-2 small bf16, batches 16 (with kernel tables) and
# 8; `pcp` first and last for the spread. Everything under $OUT is tarred into one file.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log folded_log.txt
VARIANTS="pcp unfolded pcp"
timeout 330 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla $VARIANTS --profile --results $OUT --stem folded_b16 >> $log 2>&1
stage b16 $?
timeout $((570 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 8 --precision bf16 --torch compiled --xla $VARIANTS --results $OUT --stem folded_b8 >> $log 2>&1
stage b8 $?
rm -f $OUT/*.md
gzip -f $OUT/*kernels*.txt 2>/dev/null
tar czf /tmp/folded.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/folded.tgz $OUT/
