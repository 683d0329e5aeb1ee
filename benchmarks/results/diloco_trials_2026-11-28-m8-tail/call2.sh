#!/bin/bash
# Issue 37, session 15, call 2: H = 20 at eight workers against the defaults (H = 25,
# beta1 0.7) on the benchmark's village, python and perl-docs corpora (python and
# perl-docs assembled on the 2-core machine by diloco_quality.corpora and carried in
# .device/bench), seeds 0-2, xla on the H200 machine's CPU cores; one process a corpus.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site
run() {
  local name=$1; shift
  timeout 270 python3 benchmarks/diloco_quality.py --backend xla --models tiny --workers 8 \
      --seeds 0 1 2 --variant "h20=--inner-steps 20" "$@" > $OUT/trial2_$name.log 2>&1
}
run village --corpora village --out $OUT/trial2_village &
run py --corpus py=.device/bench/python.txt --corpora py --out $OUT/trial2_py &
run perl --corpus perl=.device/bench/perl-docs.txt --corpora perl --out $OUT/trial2_perl &
wait
tail -n 2 $OUT/*.log
