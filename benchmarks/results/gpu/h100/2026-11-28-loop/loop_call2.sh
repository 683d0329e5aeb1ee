#!/bin/bash
# Issue 32, part 4, 2026-11-28, second device call (run from the repository root on the
# machine). .device/loop95/{base,new}: `git archive`s of main's 7552044 and of branch
# loop95 (the snapshot in pinned host memory, taken once before the loop);
# .device/loop95/site: structlog, platformdirs, tomli_w; the corpus beside them (all
# carried, not committed). The step benchmark, the loop of each tree three times,
# interleaved, this branch's once without evaluations inside, the step benchmark again.
set -u
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
D=$PWD/.device/loop95
declare -A PP
for tree in base new; do
  PP[$tree]=$(python3 $D/$tree/scripts/register_checkout.py /tmp/reg_$tree):$D/site
done
DS=/tmp/data/shakespeare50304
BENCH=$D/new/benchmarks
start=$SECONDS
log=$OUT/loop_call2_log.txt
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
loop() {  # label, tree, extra arguments
  (cd $D/$2 && PYTHONPATH=${PP[$2]} timeout 120 python3 $BENCH/loop_time.py run --data $DS \
      --label $1 --out /tmp/runs/$1 --results $OUT --stem loop2_b16 "${@:3}") >> $log 2>&1
  stage "loop $1" $?
}
step step2_b16_k10
loop main base
loop pinned new
loop main-again base
loop pinned-again new
loop pinned-no-eval new --eval-every 0
loop main-3 base
loop pinned-3 new
step step2b_b16_k10
PYTHONPATH=${PP[new]} python3 $BENCH/loop_time.py table --results $OUT --stem loop2_b16 \
    --step-json $OUT/step2_b16_k10.json $OUT/step2b_b16_k10.json >> $log 2>&1
grep -h "checkpoint written\|evaluated before" $log | cut -c1-110 | tail -12
grep -h extra_ms_per_evaluation $OUT/loop2_b16.jsonl | python3 -c "import sys,json; [print(r['label'], r['loop_ms_per_step'], r['median_call_ms'], r['extra_ms_per_evaluation'], [round(g - r['median_call_ms']) for g in r['record_gaps_ms'] if g > 1.03*r['median_call_ms']]) for r in map(json.loads, sys.stdin)]"
cat $OUT/loop2_b16.md
