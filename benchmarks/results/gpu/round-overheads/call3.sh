#!/bin/bash
# A DiLoCo round of GPT-2 small (bf16, one xla worker on GPU 0) with the worker's inner
# state written on a thread beside its Result and next round (this checkout) and before
# its Result (OLD_WORKER: a folder with f29d8b7's pcp_core/worker/session.py and
# loop.py and plugins/pcp-xla/pcp_xla/runtime.py), alternating after, before, after
# (NAMES: other names, before* the old files).
set -u
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site:$PWD/benchmarks
log=$OUT/log.txt
FILES="pcp_core/worker/session.py pcp_core/worker/loop.py plugins/pcp-xla/pcp_xla/runtime.py"
mkdir -p /tmp/after && for f in $FILES; do cp $f /tmp/after/$(basename $f); done
nvidia-smi --query-gpu=index,name --format=csv >> $log 2>&1
FLAGS="--data .device/stdlib --model-size gpt2-small --precision bf16 --steps 400 --inner-steps 100
       --steps-per-call 10 --lr 6e-4 --warmup-steps 30 --eval-every 100 --seed 0"
for name in ${NAMES:-after before after2}; do
  if [[ $name == before* ]]; then from=$OLD_WORKER; else from=/tmp/after; fi
  for f in $FILES; do cp $from/$(basename $f) $f; done
  timeout 200 python3 benchmarks/multi_gpu.py run --batch 16 --runs one-gpu --out /tmp/mg-$name \
      --results /tmp/res --stem $name --timeout 190 -- $FLAGS >> $log 2>&1
  echo "== $name rc=$? at ${SECONDS}s" >> $log
  cp /tmp/mg-$name/one-gpu/metrics.jsonl /tmp/res/$name-metrics.jsonl 2>> $log
  cp /tmp/mg-$name/one-gpu/worker-0.log /tmp/res/$name-worker.log 2>> $log
done
for f in $FILES; do cp /tmp/after/$(basename $f) $f; done
tar czf $OUT/runs.tgz -C /tmp/res .
