#!/bin/bash
# Issue 32, session 17, call 4: pipelined calls (the next queued before the last one's losses
# are read), PCP as shipped against the loop as one CUDA graph (`graphs`), alternated to see
# the machine's drift, beside torch.compile; each PCP row has the host's time to queue a call
# (`dispatch_ms_median`). Batch 16 at 4 steps a call (profiled: two calls back to back) and
# at 10. One archive back.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log graphs_log.txt
anchor() {  # stem, then torch_anchor's own arguments
  local stem=$1; shift
  timeout $((580 - (SECONDS - start))) python3 benchmarks/torch_anchor.py --size gpt2-small \
      --precision bf16 --torch compiled --xla pcp graphs pcp graphs --calls 10 --pipelined \
      --results $OUT --stem $stem "$@" >> $log 2>&1
  stage $stem $?
}
anchor graphs_b16 --batch 16 --profile
anchor graphs_b16_k10 --batch 16 --steps-per-call 10
rm -f $OUT/*.md
gzip -f $OUT/*kernels*.txt 2>/dev/null
tar czf /tmp/graphs.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/graphs.tgz $OUT/
