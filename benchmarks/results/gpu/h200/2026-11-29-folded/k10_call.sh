#!/bin/bash
# Issue 32, session 16, call 2: the same comparison at 10 steps a call, `pcp train`'s
# default K (the anchor's torch loop reads its losses once a call, as PCP does).
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log k10_log.txt
VARIANTS="pcp unfolded pcp"
for batch in 16 8; do
  timeout $((570 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
      --batch $batch --precision bf16 --steps-per-call 10 --torch compiled --xla $VARIANTS \
      --results $OUT --stem k10_b$batch >> $log 2>&1
  stage b$batch $?
done
rm -f $OUT/*.md
tar czf /tmp/k10.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/k10.tgz $OUT/
