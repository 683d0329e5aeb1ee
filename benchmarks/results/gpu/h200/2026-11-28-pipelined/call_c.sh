#!/bin/bash
# call C (session 10): the GPU worker alone at K steps a call, with and without a load
# on the CPU worker's cores (8-15): does K = 10 make the GPU step faster and less
# sensitive to a busy host than K = 1?  SPECS: "K:load" items.
set -u
source .device/pair3/env.sh  # cds to src/
log=$OUT/call_c_log.txt
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
for spec in ${SPECS:-10:none 10:hog 1:hog}; do
  k=${spec%%:*}; load=${spec##*:}
  hog=
  if [ $load = hog ]; then
    OPENBLAS_NUM_THREADS=8 OMP_NUM_THREADS=8 taskset -c 8-15 python3 -c '
import numpy as np
a = np.random.rand(2048, 2048).astype(np.float32)
while True:
    a = (a @ a) / 2048.0
' & hog=$!
  fi
  flags=(--model-size shakespeare-char --data $D/stdlib --batch-size 16 --steps-per-call $k
         --inner-steps 500 --steps ${STEPS:-6000} --lr 1e-3 --inner-lr-scaling none
         --merge tokens --overlap delayed --eval-every 1000 --seed 0 --round-budget auto)
  rm -rf /tmp/gu
  timeout $((590 - (SECONDS - start))) python3 benchmarks/gpu_unequal.py run --runs alone \
      --cache $D/cache --out /tmp/gu --results $OUT --stem alone_k${k}_${load} \
      --timeout ${RUN_TIMEOUT:-200} -- "${flags[@]}" >> $log 2>&1
  echo "== k=$k load=$load rc=$? at $((SECONDS - start))s" >> $log
  [ -n "$hog" ] && kill $hog
  cp /tmp/gu/alone/shepherd/metrics.jsonl $OUT/alone_k${k}_${load}_metrics.jsonl 2>/dev/null
  grep -h 'ms\|compute_s' /tmp/gu/alone/gpu.log | tail -3 | cut -c1-400 >> $log
done
