#!/bin/bash
# Issue 32, session 17, call 5: `pcp train --backend xla` (GPT-2 small, bf16, batch 16) with
# its calls pipelined (this tree) against the loop that waited for each call (0a290ab, a
# `git archive` carried in .device/loopbase), alternated, at 10 steps a call (evaluations
# every 100 steps) and at 4; beside the step alone, waited for and pipelined. The corpus
# (.device/data/tinyshakespeare.txt) is carried, not committed. One archive back.
set -u
source scripts/device_env.sh
export XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
NEW=$PYTHONPATH
BASE=$(python3 .device/loopbase/scripts/register_checkout.py /tmp/reg_base):/tmp/site
DS=/tmp/data/shakespeare50304
call_log loop_log.txt
timeout 90 python3 benchmarks/loop_time.py prepare .device/data/tinyshakespeare.txt -o $DS >> $log 2>&1
stage prepare $?
for mode in waited pipelined; do
  flag=$([ $mode = pipelined ] && echo --pipelined)
  timeout 120 python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 --steps-per-call 10 \
      --precision bf16 --torch --xla pcp $flag --results $OUT --stem step_${mode}_b16_k10 >> $log 2>&1
  stage "step $mode" $?
done
loop() {  # label, tree's PYTHONPATH, steps per call
  PYTHONPATH=$2 timeout $((585 - (SECONDS - start))) python3 benchmarks/loop_time.py run \
      --data $DS --label $1 --batch 16 --steps 400 --steps-per-call $3 --eval-every 100 \
      --out /tmp/runs/$1 --results $OUT --stem loop_b16 >> $log 2>&1
  stage "loop $1" $?
}
loop pipelined $NEW 10; loop waited $BASE 10
loop pipelined-again $NEW 10; loop waited-again $BASE 10
loop pipelined-k4 $NEW 4; loop waited-k4 $BASE 4
python3 benchmarks/loop_time.py table --results $OUT --stem loop_b16 \
    --step-json $OUT/step_waited_b16_k10.json $OUT/step_pipelined_b16_k10.json >> $log 2>&1
rm -f $OUT/step_*.md
tar czf /tmp/loop.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/loop.tgz $OUT/
