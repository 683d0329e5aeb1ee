#!/bin/bash
# Issue 32, session 21, call 4, with the compile cache counting only files named as PCP
# and jax name theirs: (a) `pcp train` with an `xla` worker, then `pcp cache show` and the
# cache's folders and some of its file names (call 3 left 139 files it did not know);
# a second run under a 1 MB limit; (b) batches 16 and 8 in turns with torch.compile again.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false
call_log cache_log.txt
export PCP_CACHE_DIR=/tmp/cache_train
train() {  # run directory, then environment settings
  env "${@:2}" timeout 120 python3 -m pcp_core --log-format console train --algorithm diloco \
      --backend xla --worker-backends xla --model-size gpt2-small --precision bf16 \
      --steps 20 --inner-steps 10 --batch-size 16 --no-dashboard --out $1 > $1.txt 2>&1
  stage "train $1" $?
  grep -h "program ready" $1/worker-0.log >> $log
  grep -h "trimmed\|could not" $1.txt $1/worker-0.log >> $log
}
train /tmp/run1 PCP_CACHE_MAX_GB=10
python3 -m pcp_core cache show >> $log 2>&1
find $PCP_CACHE_DIR -type d | while read d; do echo "$(ls -A $d | wc -l) $d"; done >> $log
find $PCP_CACHE_DIR -type f | sed -n '1~20p' | head -20 >> $log
train /tmp/run2 PCP_CACHE_MAX_GB=0.001
python3 -m pcp_core cache show >> $log 2>&1
find $PCP_CACHE_DIR -type f | wc -l >> $log
PCP_CACHE_DIR=/tmp/cache_anchor timeout 300 python3 benchmarks/torch_anchor.py \
    --size gpt2-small --precision bf16 --batch 16 8 --steps-per-call 10 --calls 20 \
    --interleave --torch compiled --xla pcp --peak-tflops 989 --power --results $OUT \
    --stem cache_k10 >> $log 2>&1
stage turns $?
rm -f $OUT/*.md
tar czf /tmp/cache.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/cache.tgz $OUT/
