#!/bin/bash
# Issue 32, session 17, call 3: GPT-2 small bf16 against torch.compile with each call waited
# for (as every anchor table so far) and pipelined (the next call queued before the last
# one's losses are read, as `pcp train` now runs and DiLoCo's workers ran; torch's losses
# copied to pinned memory behind its steps, so it is queued ahead the same way). Batch 16
# at 4 and 10 steps a call, batch 8 at 4; 10 timed calls each. One archive back.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log anchor_log.txt
anchor() {  # stem, then torch_anchor's own arguments
  local stem=$1; shift
  timeout $((580 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
      --precision bf16 --torch compiled --xla pcp --calls 10 --results $OUT --stem $stem "$@" >> $log 2>&1
  stage $stem $?
}
anchor waited_b16 --batch 16
anchor pipelined_b16 --batch 16 --pipelined
anchor pipelined_b16_k10 --batch 16 --steps-per-call 10 --pipelined
anchor waited_b16_k10 --batch 16 --steps-per-call 10
anchor pipelined_b8 --batch 8 --pipelined
anchor waited_b8 --batch 8
rm -f $OUT/*.md
tar czf /tmp/anchor.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/anchor.tgz $OUT/
