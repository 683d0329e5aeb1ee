#!/bin/bash
# Issue 32, session 17, call 6: the same loops as loop_call.sh for a small model, where a
# call is short and the host's share of it large: shakespeare-char's shape (6 layers,
# width 384, block 256) on the same BPE data, batch 64, at 1 and 10 steps a call; this
# tree's pipelined loop against 0a290ab's, alternated. One archive back.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
NEW=$PYTHONPATH
BASE=$(python3 .device/loopbase/scripts/register_checkout.py /tmp/reg_base):/tmp/site
DS=/tmp/data/shakespeare50304
call_log small_log.txt
timeout 90 python3 benchmarks/loop_time.py prepare .device/data/tinyshakespeare.txt -o $DS >> $log 2>&1
stage prepare $?
loop() {  # label, tree's PYTHONPATH, steps per call
  PYTHONPATH=$2 timeout $((290 - (SECONDS - start))) python3 benchmarks/loop_time.py run \
      --data $DS --label $1 --model-size shakespeare-char --batch 64 --steps 600 \
      --steps-per-call $3 --eval-every 200 --out /tmp/runs/$1 --results $OUT --stem small_loop >> $log 2>&1
  stage "loop $1" $?
}
loop pipelined-k1 $NEW 1; loop waited-k1 $BASE 1
loop pipelined-k1-again $NEW 1; loop waited-k1-again $BASE 1
loop pipelined-k10 $NEW 10; loop waited-k10 $BASE 10
tar czf /tmp/small.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/small.tgz $OUT/
