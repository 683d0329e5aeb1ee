#!/bin/bash
# Issue 37, 2026-11-28 (session 15): the fifth held-out pair (npm's JavaScript and npm's
# markdown, built before this session's change of default; recipe in docs/diloco-quality.md,
# carried in .device/heldout5) with the workers' beta1 at 0.7, M = 4 and 8, seeds 0-4, on
# the H200 machine's 16 CPU cores through the xla backend (jax on the CPU: IREE's compiler
# is not on that machine). Each corpus is a benchmark process of its own, the two side by
# side. .device/anchor carried (wheels).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site .device/anchor/wheels/*.whl || exit 1
export JAX_PLATFORMS=cpu PYTHONUNBUFFERED=1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
for corpus in npm-js npm-markdown; do
  timeout 560 python3 benchmarks/diloco_quality.py --backend xla --models tiny --workers 4 8 \
      --seeds 0 1 2 3 4 --corpus $corpus=.device/heldout5/$corpus.txt --corpora $corpus \
      --out $OUT/heldout5_xla_$corpus > $OUT/heldout5_xla_$corpus.log 2>&1 &
done
wait
tail -n 3 $OUT/*.log
