#!/bin/bash
# Issue 37, session 16, call 1: at four workers, H = 20 against the defaults (H = 25, beta1
# 0.7), seeds 0-2, on the five corpora of the eight-worker trial (CMake, the man pages,
# village, python, perl-docs), xla on the H200 machine's CPU cores; one process a corpus.
set -u
source scripts/device_env.sh
export JAX_PLATFORMS=cpu
run() {
  local name=$1; shift
  timeout 560 python3 benchmarks/diloco_quality.py --backend xla --models tiny --workers 4 \
      --seeds 0 1 2 --variant "h20=--inner-steps 20" "$@" > $OUT/m4_$name.log 2>&1
}
run cmake --corpus cmake=.device/heldout/cmake-modules.txt --corpora cmake --out $OUT/m4_cmake &
run man --corpus man=.device/devcorpus/manpages.txt --corpora man --out $OUT/m4_man &
run village --corpora village --out $OUT/m4_village &
run py --corpus py=.device/bench/python.txt --corpora py --out $OUT/m4_py &
run perl --corpus perl=.device/bench/perl-docs.txt --corpora perl --out $OUT/m4_perl &
wait
tail -n 2 $OUT/*.log
