#!/bin/bash
# Issue 32, session 16: where "the rest" of the step's kernels goes at batch 16. The
# optimizer alone in three forms (adamw_forms.py), then the shipped step beside
# torch.compile with kernel tables and the compiled step's optimized HLO, to name them.
# (Session 16, call 1 lost its files: a call brings back 8; call 2 ran it again, tarred.)
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
here=benchmarks/results/gpu/h200/2026-11-29-optimizer
log=$OUT/optimizer_log.txt
machine_banner $log
timeout 150 python3 $here/adamw_forms.py >> $log 2>&1
echo "== adamw_forms rc=$?" >> $log
timeout 400 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --precision bf16 \
    --torch compiled --xla pcp --profile --hlo-dir $OUT/hlo --results $OUT --stem opt_b16 >> $log 2>&1
echo "== anchor rc=$?" >> $log
gzip -f $OUT/hlo/* 2>/dev/null
rm -f $OUT/*.md
