#!/bin/bash
# Issue 34 on one GPU: the xla worker as it was (every step on one device, `base`: the
# checkout before multi-device workers) against the xla worker now (the step exported for
# a mesh of the worker's devices; here a mesh of one, what `--devices all` gives on a
# one-GPU machine), GPT-2 small bf16 batch 16, alternating in one call.
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
new=$PWD
log=$OUT/devices_log.txt
start=$SECONDS
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
for pair in 1 2; do
  for tree in base new; do
    dir=$new; [ $tree = base ] && dir=$new/.device/base34  # git archive 11dedaf: the checkout before this work
    left=$((480 - (SECONDS - start)))
    [ $left -lt 60 ] && { echo "== $tree $pair: no time left" >> $log; continue; }
    (cd $dir && export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg-$tree):$new/.whl/site:$dir/benchmarks \
      && timeout $left python3 benchmarks/torch_anchor.py --size gpt2-small --batch 16 \
        --precision bf16 --torch --xla pcp --calls 20 --results $OUT --stem ${tree}_$pair) >> $log 2>&1
    echo "== $tree $pair: rc=$? at $((SECONDS - start))s" >> $log
  done
done
(export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg-new):$new/.whl/site; timeout 120 python3 benchmarks/results/gpu/h200/2026-11-26-devices/export2.py) >> $log 2>&1
echo "== export2: rc=$?" >> $log
rm -f $OUT/*.md
