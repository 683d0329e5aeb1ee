#!/bin/bash
# call B: RUNS (pair, then alone by default) for SEED; rounds by time (auto), overlapped,
# merged by tokens, H = 500, --steps 10000, K steps a call.
set -u
source .device/pair3/env.sh  # cds to src/ when there
STEM=${STEM:-seed${SEED:-0}_k${K:-1}}
log=$OUT/${STEM}_log.txt
start=$SECONDS
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
rm -rf /tmp/gu
timeout $((590 - (SECONDS - start))) python3 benchmarks/gpu_unequal.py run \
    --runs ${RUNS:-pair alone} --cache $D/cache --out /tmp/gu \
    --results $OUT --stem $STEM --timeout ${RUN_TIMEOUT:-270} -- "${FLAGS[@]}" \
    --round-budget auto >> $log 2>&1
echo "== run rc=$? at $((SECONDS - start))s" >> $log
for run in alone pair; do
  cp /tmp/gu/$run/shepherd/metrics.jsonl $OUT/${STEM}_${run}_metrics.jsonl 2>/dev/null
done
(cd /tmp/gu && tar czf $OUT/${STEM}_logs.tgz */*.log) 2>> $log
grep -h '"joined"\|error\|Error' /tmp/gu/*/*.log | cut -c1-300 >> $log 2>&1
(cd /tmp/jaxcache && tar czf $OUT/jaxcache.tgz .) 2>> $log
