#!/bin/bash
# A DiLoCo round of GPT-2 small (bf16, one xla worker on GPU 0) with the shepherd's
# checkpoint beside the next round (this checkout) and on the round loop (06f58dc's
# shepherd_side.py, given as BEFORE), alternating after, before, after; then the same
# run under py-spy (every process, idle time included) for where a round's time goes.
set -u
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl .device/pyspy/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site:$PWD/benchmarks
log=$OUT/log.txt
SHEPHERD=plugins/pcp-diloco/pcp_diloco/shepherd_side.py
cp $SHEPHERD /tmp/after.py
FLAGS="--data .device/stdlib --model-size gpt2-small --precision bf16 --steps 400 --inner-steps 100
       --steps-per-call 10 --lr 6e-4 --warmup-steps 30 --eval-every 100 --seed 0"
nvidia-smi --query-gpu=index,name --format=csv >> $log 2>&1
for name in after before after2; do
  if [ $name = before ]; then cp $BEFORE $SHEPHERD; else cp /tmp/after.py $SHEPHERD; fi
  timeout 200 python3 benchmarks/multi_gpu.py run --batch 16 --runs one-gpu --out /tmp/mg-$name \
      --results $OUT --stem $name --timeout 190 -- $FLAGS >> $log 2>&1
  echo "== $name rc=$? at ${SECONDS}s" >> $log
  cp /tmp/mg-$name/one-gpu/metrics.jsonl $OUT/$name-metrics.jsonl 2>> $log
done
cp /tmp/after.py $SHEPHERD
timeout 200 /tmp/site/bin/py-spy record --subprocesses --idle -r 50 -f raw -o $OUT/profile.txt -- \
    python3 -m pcp_core train --algorithm diloco --backend xla --worker-backends xla \
    --batch-size 16 --out /tmp/prof --no-dashboard --overwrite $FLAGS >> $log 2>&1
echo "== profile rc=$? at ${SECONDS}s" >> $log
cp /tmp/prof/metrics.jsonl $OUT/profile-metrics.jsonl 2>> $log
