#!/bin/bash
# Issue 37, session 15, call 1: at eight workers, H = 20 and the workers' beta1 at 0.6 against the
# defaults (beta1 0.7, H = 25), seeds 0-2, on CMake (tuned on) and the man-page dev corpus,
# xla on the H200 machine's CPU cores; one benchmark process a corpus.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site
for path in .device/heldout/cmake-modules.txt .device/devcorpus/manpages.txt; do
  corpus=$(basename $path .txt)
  timeout 560 python3 benchmarks/diloco_quality.py --backend xla --models tiny --workers 8 \
      --seeds 0 1 2 --corpus $corpus=$path --corpora $corpus \
      --variant "h20=--inner-steps 20" --variant "b06=--inner-momentum-decay 0.6" \
      --out $OUT/trial_$corpus > $OUT/trial_$corpus.log 2>&1 &
done
wait
tail -n 2 $OUT/*.log
