#!/bin/bash
# Issue 32, session 17, call 2: where the GPU sits idle within a step. GPT-2 small bf16,
# batch 16, 4 steps a call: torch.compile, PCP with and without the vectors joined, and
# PCP as one CUDA graph (`graphs`), each profiled (kernel tables with torch_anchor's
# `idle_report`), and the optimized HLO of each PCP program (to name the D2D copies).
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log idle_log.txt
timeout 560 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 --batch 16 \
    --torch compiled --xla pcp ungrouped graphs --profile --hlo-dir $OUT/hlo \
    --results $OUT --stem idle_b16 >> $log 2>&1
echo "== idle_b16: rc=$? at $((SECONDS - start))s" >> $log
rm -f $OUT/*.md
gzip -f $OUT/*kernels*.txt $OUT/hlo/* 2>/dev/null
tar czf /tmp/idle.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/idle.tgz $OUT/
