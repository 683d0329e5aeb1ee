#!/bin/bash
# A DiLoCo round of GPT-2 small (bf16, one xla worker on GPU 0) with the shepherd's passes
# over the model (checks, norms, float64 sum, mean, step guard, Nesterov) on the host's
# cores, a 4 MiB piece each (pcp_core.parallel; this checkout), and on one core (OLD: a
# folder with 93779a7's aggregation.py, step_guard.py, channel.py and pcp-nesterov's
# __init__.py), alternating after, before, after, before (NAMES: other names, before*
# the old files).
set -u
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site:$PWD/benchmarks
log=$OUT/log.txt
FILES="pcp_core/shepherd/aggregation.py pcp_core/shepherd/step_guard.py pcp_core/wire/channel.py
       plugins/pcp-nesterov/pcp_nesterov/__init__.py"
mkdir -p /tmp/after5 && for f in $FILES; do cp $f /tmp/after5/$(basename $f); done
nvidia-smi --query-gpu=index,name --format=csv >> $log 2>&1
FLAGS="--data .device/stdlib --model-size gpt2-small --precision bf16 --steps 400 --inner-steps 100
       --steps-per-call 10 --lr 6e-4 --warmup-steps 30 --eval-every 100 --seed 0"
for name in ${NAMES:-after before after2 before2}; do
  if [[ $name == before* ]]; then from=$OLD; else from=/tmp/after5; fi
  for f in $FILES; do cp $from/$(basename $f) $f; done
  timeout 200 python3 benchmarks/multi_gpu.py run --batch 16 --runs one-gpu --out /tmp/mg5-$name \
      --results /tmp/res5 --stem $name --timeout 190 -- $FLAGS >> $log 2>&1
  echo "== $name rc=$? at ${SECONDS}s" >> $log
  cp /tmp/mg5-$name/one-gpu/metrics.jsonl /tmp/res5/$name-metrics.jsonl 2>> $log
done
for f in $FILES; do cp /tmp/after5/$(basename $f) $f; done
tar czf $OUT/runs.tgz -C /tmp/res5 .
