#!/bin/bash
# Issue 32, part 4, 2026-11-28, first device call (run from the repository root on the
# machine). .device/loop95/{base,new,pinned}: `git archive`s of main's 7552044, of branch
# loop95 (params_snapshot starts copy_to_host_async) and of a trial (the snapshot in pinned
# host memory); .device/loop95/site: structlog, platformdirs, tomli_w; the corpus beside
# them (all carried, not committed). Step benchmark, overlap.py, then the loop of each
# tree twice, interleaved, then the step benchmark again.
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
D=$PWD/.device/loop95
declare -A PP
for tree in base new pinned; do
  PP[$tree]=$(python3 $D/$tree/scripts/register_checkout.py /tmp/reg_$tree):$D/site
done
DS=/tmp/data/shakespeare50304
BENCH=$D/new/benchmarks
start=$SECONDS
log=$OUT/loop_call1_log.txt
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  python3 -c "import jax, torch, safetensors; print('jax', jax.__version__, 'torch', torch.__version__, 'safetensors', safetensors.__version__)"
  nproc; } >> $log 2>&1
PYTHONPATH=${PP[new]} timeout 60 python3 $BENCH/loop_time.py prepare $D/tinyshakespeare.txt -o $DS >> $log 2>&1
stage prepare $?
step() {
  (cd $D/new && PYTHONPATH=${PP[new]}:$BENCH timeout 150 python3 $BENCH/torch_anchor.py \
    --size gpt2-small --batch 16 --steps-per-call 10 --precision bf16 --torch --xla pcp \
    --results $OUT --stem $1) >> $log 2>&1
  stage "step $1" $?
}
step step1_b16_k10
(cd $D/new && PYTHONPATH=${PP[new]} timeout 120 python3 \
  $BENCH/results/gpu/h100/2026-11-28-loop/overlap.py --out $OUT/overlap1.jsonl) >> $log 2>&1
stage overlap $?
loop() {  # label, tree
  (cd $D/$2 && PYTHONPATH=${PP[$2]} timeout 120 python3 $BENCH/loop_time.py run --data $DS \
      --label $1 --out /tmp/runs/$1 --results $OUT --stem loop1_b16) >> $log 2>&1
  stage "loop $1" $?
}
loop main base
loop async new
loop pinned pinned
loop main-again base
loop async-again new
loop pinned-again pinned
step step1b_b16_k10
PYTHONPATH=${PP[new]} python3 $BENCH/loop_time.py table --results $OUT --stem loop1_b16 \
    --step-json $OUT/step1_b16_k10.json $OUT/step1b_b16_k10.json >> $log 2>&1
grep -h "checkpoint written\|\"evaluating\"\|\"state\": \"training\", \"step\"" $log | cut -c1-110 | tail -30
cat $OUT/overlap1.jsonl
grep -h extra_ms_per_evaluation $OUT/loop1_b16.jsonl | python3 -c "import sys,json; [print(r['label'], r['loop_ms_per_step'], r['median_call_ms'], r['extra_ms_per_evaluation'], [g for g in r['record_gaps_ms'] if g > 1.05*r['median_call_ms']]) for r in map(json.loads, sys.stdin)]"
cat $OUT/loop1_b16.md
