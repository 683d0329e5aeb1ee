#!/bin/bash
# Issue 32, part 4, second device call (H100): the loop with a trial checkpoint writer of
# PCP's own (plain file writes of the arrays' bytes instead of safetensors' save_file, to
# leave the interpreter to the loop; it gained nothing measurable and is not committed),
# beside the step benchmark (xla only; the anchor's row is call 1's). As loop_call1.sh.
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
ROOT=$PWD
NEW=$(python3 scripts/register_checkout.py /tmp/reg):$ROOT/.whl/site
DS=/tmp/data/shakespeare50304
start=$SECONDS
log=$OUT/loop_call2_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
PYTHONPATH=$NEW timeout 60 python3 benchmarks/loop_time.py prepare \
    .device/loop/tinyshakespeare.txt -o $DS >> $log 2>&1
stage prepare $?
PYTHONPATH=$NEW:$ROOT/benchmarks timeout 120 python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 16 --steps-per-call 10 --precision bf16 --torch --xla pcp \
    --results $OUT --stem step2_b16_k10 >> $log 2>&1
stage step $?
for label in pcp pcp-again; do
  PYTHONPATH=$NEW timeout 120 python3 benchmarks/loop_time.py run --data $DS --label $label \
      --out /tmp/runs/$label --results $OUT --stem loop2_b16 >> $log 2>&1
  stage "loop $label" $?
done
PYTHONPATH=$NEW python3 benchmarks/loop_time.py table --results $OUT --stem loop2_b16 \
    --step-json $OUT/step2_b16_k10.json >> $log 2>&1
grep -h "checkpoint written" $log | cut -c1-120
cat $OUT/loop2_b16.md
