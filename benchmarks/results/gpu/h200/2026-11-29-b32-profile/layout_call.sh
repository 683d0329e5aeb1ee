#!/bin/bash
# Issue 32, session 18, call 2: at batch 32 XLA laid the float32 residual stream out
# batch-minor (f32[32,1024,768]{0,2,1}) and transposed it wherever it is read, 6.6 ms a
# step of `input_transpose_fusion`s (call 1). Here: XLA's HLO before and after layout
# assignment at batch 32 (what chose the layout), then the two sums over the batch in
# forms of PCP's own (`staged-sums`, `position-product`) at 32, 24 and 16, timed, with
# their optimized HLO.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log layout_log.txt
XLA_FLAGS="--xla_dump_to=$OUT/passes --xla_dump_hlo_pass_re=layout-assignment" \
    timeout 120 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 32 --calls 1 --torch --xla pcp --results $OUT --stem passes >> $log 2>&1
stage passes $?
find $OUT/passes -type f ! -name "*jit_call*" -delete
timeout 400 python3 benchmarks/torch_anchor.py --size gpt2-small --precision bf16 \
    --batch 32 24 16 --torch compiled --xla pcp staged-sums position-product staged-position \
    --hlo-dir $OUT/hlo --peak-tflops 989 --results $OUT --stem layout >> $log 2>&1
stage layout $?
rm -f $OUT/*.md
gzip -f $OUT/hlo/* $OUT/passes/* 2>/dev/null
tar czf /tmp/layout.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/layout.tgz $OUT/
