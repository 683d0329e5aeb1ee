#!/bin/bash
# A DiLoCo round of GPT-2 small (bf16, one xla worker on GPU 0) with this checkout's
# FILES (names "after*") and with the files of the same names in the folder OLD
# ("before*"), one run each, in the order NAMES gives (default: after before after2
# before2). Metrics of each run in $OUT/runs.tgz.
set -u
source benchmarks/results/gpu/round-overheads/device_env.sh
mkdir -p /tmp/ab-after && for f in $FILES; do cp $f /tmp/ab-after/$(basename $f); done
for name in ${NAMES:-after before after2 before2}; do
  if [[ $name == before* ]]; then from=$OLD; else from=/tmp/ab-after; fi
  for f in $FILES; do cp $from/$(basename $f) $f; done
  timeout 200 python3 benchmarks/multi_gpu.py run --batch 16 --runs one-gpu --out /tmp/ab-$name \
      --results /tmp/ab-res --stem $name --timeout 190 -- $FLAGS >> $log 2>&1
  echo "== $name rc=$? at ${SECONDS}s" >> $log
  cp /tmp/ab-$name/one-gpu/metrics.jsonl /tmp/ab-res/$name-metrics.jsonl 2>> $log
done
for f in $FILES; do cp /tmp/ab-after/$(basename $f) $f; done
tar czf $OUT/runs.tgz -C /tmp/ab-res .
