#!/bin/bash
# Issue 35, call 2: probe.py (the two-GPU step alone, tracebacks printed), then
# benchmarks/multi_gpu.py: the two-GPU worker and one GPU again beside it (RUNS: which,
# in order; iree-workers needs .device/cache, the compile cache made here from call 1's
# dump by `python benchmarks/gpu_unequal.py prewarm DUMP --cache .device/cache`).
set -u
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site:$PWD/benchmarks
call=${CALL:-call2}
log=$OUT/${call}_log.txt
start=$SECONDS
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
nvidia-smi --query-gpu=index,name,pci.bus_id --format=csv >> $log 2>&1
[ -z "${NO_PROBE:-}" ] && { timeout 150 python3 benchmarks/results/gpu/h200x2/2026-11-26/probe.py >> $log 2>&1; stage probe $?; }
FLAGS="--data .device/stdlib --model-size gpt2-small --precision bf16 --steps 400 --inner-steps 100
       --steps-per-call 10 --lr 6e-4 --warmup-steps 30 --eval-every 100 --seed 0"
for run in ${RUNS:-two-gpu-worker one-gpu one-gpu-global}; do
  left=$((570 - (SECONDS - start)))
  [ $left -lt 100 ] && { stage "$run skipped" 0; continue; }
  timeout $left python3 benchmarks/multi_gpu.py run --batch 16 --runs $run --out /tmp/mg \
      ${CACHE:+--cache $CACHE} --results /tmp/res --stem $run --timeout $((left - 5)) -- $FLAGS >> $log 2>&1
  stage $run $?
  # the rest compare with the two-GPU worker: without it they would spend device time for nothing
  [ $run = two-gpu-worker ] && [ ! -f /tmp/res/two-gpu-worker.json ] && break
done
python3 benchmarks/multi_gpu.py report /tmp/res/*.json --results $OUT --stem $call >> $log 2>&1
(cd /tmp/mg && tar czf $OUT/${call}_runs.tgz *.log *.csv */metrics.jsonl */summary.json */worker-*.log) 2>> $log
