#!/bin/bash
# The seal of GPT-2 small's parameters on the GPU machine's CPU (benchmarks/seal.py), then
# a DiLoCo round of GPT-2 small (bf16, one xla worker on GPU 0) with chunk digests in the
# seal (protocol 9, this checkout) and one HMAC stream (protocol 8: OLD_CHANNEL and
# OLD_MESSAGES, the files of commit c2c2480), alternating 9, 8, 9.
set -u
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site:$PWD/benchmarks
log=$OUT/log.txt
CHANNEL=pcp_core/wire/channel.py MESSAGES=pcp_core/wire/messages.py
cp $CHANNEL /tmp/channel9.py; cp $MESSAGES /tmp/messages9.py
nvidia-smi --query-gpu=index,name --format=csv >> $log 2>&1
nproc >> $log
python3 benchmarks/seal.py >> $log 2>&1 && cp benchmarks/results/seal.json benchmarks/results/seal.md $OUT/
FLAGS="--data .device/stdlib --model-size gpt2-small --precision bf16 --steps 400 --inner-steps 100
       --steps-per-call 10 --lr 6e-4 --warmup-steps 30 --eval-every 100 --seed 0"
for name in seal9 seal8 seal9b; do
  if [ $name = seal8 ]; then cp $OLD_CHANNEL $CHANNEL; cp $OLD_MESSAGES $MESSAGES
  else cp /tmp/channel9.py $CHANNEL; cp /tmp/messages9.py $MESSAGES; fi
  timeout 200 python3 benchmarks/multi_gpu.py run --batch 16 --runs one-gpu --out /tmp/mg-$name \
      --results /tmp/res --stem $name --timeout 190 -- $FLAGS >> $log 2>&1
  echo "== $name rc=$? at ${SECONDS}s" >> $log
  cp /tmp/mg-$name/one-gpu/metrics.jsonl /tmp/res/$name-metrics.jsonl 2>> $log
done
cp /tmp/channel9.py $CHANNEL; cp /tmp/messages9.py $MESSAGES
tar czf $OUT/runs.tgz -C /tmp/res .
