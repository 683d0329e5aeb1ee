#!/bin/bash
# Issue 37, 2026-11-29 (session 16): the sixth held-out pair (Tcl/Tk's scripts and the Google
# Cloud SDK's YAML, built in session 15 before H = 20 at three to eight workers was tried and
# not looked at; recipe in docs/diloco-quality.md, carried in .device/heldout6), with the
# defaults as of this session, M = 4 and 8, seeds 0-4, on the H200 machine's CPU cores
# through the xla backend. Four benchmark processes side by side: each corpus's seeds 0-2
# and 3-4. .device/anchor carried (wheels).
set -u
source scripts/device_env.sh
export JAX_PLATFORMS=cpu
for corpus in tcl-tk gcloud-yaml; do
  for seeds in "0 1 2" "3 4"; do
    part=${seeds// /}
    timeout 560 python3 benchmarks/diloco_quality.py --backend xla --models tiny --workers 4 8 \
        --seeds $seeds --corpus $corpus=.device/heldout6/$corpus.txt --corpora $corpus \
        --out $OUT/heldout6_xla_${corpus}_$part > $OUT/heldout6_xla_${corpus}_$part.log 2>&1 &
  done
done
wait
tail -n 3 $OUT/*.log
