#!/bin/bash
# 2026-11-27: the xla step of GPT-2 small bf16 with the learning-rate schedule as program
# state (this checkout) against the schedule as constants (.device/sched_before: a `git
# archive` of f72a8a8, carried, not committed), alternating, in one device call; run from
# the repository root on the machine. No torch rows: the A/B is PCP against itself.
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
ROOT=$PWD
NEW=$(python3 scripts/register_checkout.py /tmp/reg):$ROOT/.whl/site
OLD=$(python3 .device/sched_before/scripts/register_checkout.py /tmp/regold):$ROOT/.whl/site
log=$OUT/log.txt
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax; print('jax', jax.__version__)"; } >> $log 2>&1
for name in state constants state2 constants2; do
  if [[ $name == state* ]]; then dir=$ROOT; path=$NEW; else dir=$ROOT/.device/sched_before; path=$OLD; fi
  (cd $dir && PYTHONPATH=$path:$dir/benchmarks timeout 240 python3 benchmarks/torch_anchor.py \
      --size gpt2-small --batch 8 16 --steps-per-call 10 --precision bf16 --torch --xla pcp \
      --results $OUT --stem $name) >> $log 2>&1
  echo "== $name rc=$? at ${SECONDS}s" >> $log
done
