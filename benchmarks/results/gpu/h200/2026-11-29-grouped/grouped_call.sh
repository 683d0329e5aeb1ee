#!/bin/bash
# Issue 32, session 17: the model's vectors joined into one tensor for the optimizer
# (pcp_core.program.vectors, shipped as `pcp`) against the export without the join
# (`ungrouped`), beside torch.compile, GPT-2 small bf16: batch 16 at 4 steps a call (with
# kernel tables) and at 10 (`pcp train`'s default), batch 8 at 4; `pcp` first and last for
# the spread. Everything under $OUT is tarred into one file.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log grouped_log.txt
VARIANTS="pcp ungrouped pcp"
anchor() {  # stem, then torch_anchor's own arguments
  local stem=$1; shift
  timeout $((575 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
      --precision bf16 --torch compiled --xla $VARIANTS --results $OUT --stem $stem "$@" >> $log 2>&1
  stage $stem $?
}
anchor grouped_b16 --batch 16 --profile
anchor grouped_b16_k10 --batch 16 --steps-per-call 10
anchor grouped_b8 --batch 8
rm -f $OUT/*.md
gzip -f $OUT/*kernels*.txt 2>/dev/null
tar czf /tmp/grouped.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/grouped.tgz $OUT/
