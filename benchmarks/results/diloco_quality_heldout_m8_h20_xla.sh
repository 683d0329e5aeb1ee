#!/bin/bash
# Issue 37, 2026-11-29 (session 16): five of the ten earlier held-out corpora at eight
# workers with H = 20 (the defaults since this session), seeds 0-4, through xla on the H200
# machine's CPU cores; the other five ran on IREE's CPU backend on the 2-core machine.
# One benchmark process for each corpus's seeds 0-2 and 3-4, ten side by side.
# .device/anchor, .device/heldout, .device/heldout3, .device/heldout4, .device/heldout5 carried.
set -u
source scripts/device_env.sh
export JAX_PLATFORMS=cpu
for path in .device/heldout/c-headers.txt .device/heldout3/debian-copyright.txt \
    .device/heldout3/doc-news-readme.txt .device/heldout4/vim-syntax.txt .device/heldout5/npm-js.txt; do
  corpus=$(basename $path .txt)
  for seeds in "0 1 2" "3 4"; do
    part=${seeds// /}
    timeout 440 python3 benchmarks/diloco_quality.py --backend xla --models tiny --workers 8 \
        --seeds $seeds --corpus $corpus=$path --corpora $corpus \
        --out $OUT/m8_${corpus}_$part > $OUT/m8_${corpus}_$part.log 2>&1 &
  done
done
wait
tail -qn 1 $OUT/*.log
tar czf /tmp/m8.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/m8.tgz $OUT/
