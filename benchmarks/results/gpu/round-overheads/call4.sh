#!/bin/bash
# A DiLoCo round of GPT-2 small (bf16, one xla worker on GPU 0) with numpy's OpenBLAS on
# one thread (pcp's default since 7af202f) and on 16 (OPENBLAS_NUM_THREADS=16, as it was:
# one a core here), alternating 1, 16, 1, 16.
set -u
source benchmarks/results/gpu/round-overheads/device_env.sh
for name in blas1 blas16 blas1b blas16b; do
  threads=${name#blas}; threads=${threads%b}
  OPENBLAS_NUM_THREADS=$threads timeout 200 python3 benchmarks/multi_gpu.py run --batch 16 \
      --runs one-gpu --out /tmp/mg-$name --results /tmp/res --stem $name --timeout 190 -- $FLAGS >> $log 2>&1
  echo "== $name rc=$? at ${SECONDS}s" >> $log
  cp /tmp/mg-$name/one-gpu/metrics.jsonl /tmp/res/$name-metrics.jsonl 2>> $log
done
tar czf $OUT/runs.tgz -C /tmp/res .
