#!/bin/bash
# Issue 32, part 4, 2026-11-26, first device call, on an H100 (run from the repository
# root on the machine). The working tree is this session's; .device/loop/base is a
# `git archive` of 962ed2f (the loop before this work) and .device/loop/tinyshakespeare.txt
# the corpus (both carried, not committed); structlog, platformdirs and tomli_w in .whl/site.
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
ROOT=$PWD
NEW=$(python3 scripts/register_checkout.py /tmp/reg):$ROOT/.whl/site
BASE=$(python3 .device/loop/base/scripts/register_checkout.py /tmp/regbase):$ROOT/.whl/site
DS=/tmp/data/shakespeare50304
start=$SECONDS
log=$OUT/loop_call1_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch; print('jax', jax.__version__, 'torch', torch.__version__)"; } >> $log 2>&1
# 0. the dataset: a BPE of the corpus padded to GPT-2's 50304 ids, then `pcp data prepare`
PYTHONPATH=$NEW timeout 60 python3 benchmarks/loop_time.py prepare \
    .device/loop/tinyshakespeare.txt -o $DS >> $log 2>&1
stage prepare $?
# 1. the step benchmark at the loop's batch and steps per call, the anchor beside it
PYTHONPATH=$NEW:$ROOT/benchmarks timeout 200 python3 benchmarks/torch_anchor.py --size gpt2-small \
    --batch 16 --steps-per-call 10 --precision bf16 --torch compiled --xla pcp \
    --results $OUT --stem step_b16_k10 >> $log 2>&1
stage step $?
loop() {  # label, code dir, python path, extra args
  (cd $2 && PYTHONPATH=$3 timeout 150 python3 $ROOT/benchmarks/loop_time.py run --data $DS \
      --label $1 --out /tmp/runs/$1 --results $OUT --stem loop_b16 "${@:4}") >> $log 2>&1
  stage "loop $1" $?
}
# 2. the loop, this work's and the one before, evaluating every 100 steps (the default)
loop pcp $ROOT $NEW
loop before .device/loop/base $BASE
# 3. this work's without evaluations inside (one at the end), and once more as it ships
loop pcp-no-eval $ROOT $NEW --eval-every 0
loop pcp-again $ROOT $NEW
PYTHONPATH=$NEW python3 benchmarks/loop_time.py table --results $OUT --stem loop_b16 \
    --step-json $OUT/step_b16_k10.json >> $log 2>&1
cat $OUT/loop_b16.md
