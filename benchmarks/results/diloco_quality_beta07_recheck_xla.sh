#!/bin/bash
# Issue 37, 2026-11-28 (session 15): the workers' beta1 at 0.7 on the three earlier held-out
# corpora with the highest eight-worker means at 0.8 (CMake modules, vim help, Debian
# changelogs), M = 8, seeds 0-4, on the H200 machine's 16 CPU cores through the xla
# backend, as their 0.8 runs were (vim help's on IREE's CPU backend). One benchmark process
# a corpus, side by side. .device/anchor, .device/heldout and .device/heldout4 carried.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
for path in .device/heldout/cmake-modules.txt .device/heldout4/vim-help.txt \
    .device/heldout/debian-changelogs.txt; do
  corpus=$(basename $path .txt)
  timeout 560 python3 benchmarks/diloco_quality.py --backend xla --models tiny --workers 8 \
      --seeds 0 1 2 3 4 --corpus $corpus=$path --corpora $corpus \
      --out $OUT/beta07_xla_$corpus > $OUT/beta07_xla_$corpus.log 2>&1 &
done
wait
tail -n 3 $OUT/*.log
