#!/bin/bash
# A DiLoCo round of GPT-2 small (bf16, one xla worker on GPU 0) with numpy's OpenBLAS on
# one thread (pcp's default since 7af202f) and on 16 (OPENBLAS_NUM_THREADS=16, as it was:
# one a core here), alternating 1, 16, 1, 16.
set -u
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site:$PWD/benchmarks
log=$OUT/log.txt
nvidia-smi --query-gpu=index,name --format=csv >> $log 2>&1
nproc >> $log
FLAGS="--data .device/stdlib --model-size gpt2-small --precision bf16 --steps 400 --inner-steps 100
       --steps-per-call 10 --lr 6e-4 --warmup-steps 30 --eval-every 100 --seed 0"
for name in blas1 blas16 blas1b blas16b; do
  threads=${name#blas}; threads=${threads%b}
  OPENBLAS_NUM_THREADS=$threads timeout 200 python3 benchmarks/multi_gpu.py run --batch 16 \
      --runs one-gpu --out /tmp/mg-$name --results /tmp/res --stem $name --timeout 190 -- $FLAGS >> $log 2>&1
  echo "== $name rc=$? at ${SECONDS}s" >> $log
  cp /tmp/mg-$name/one-gpu/metrics.jsonl /tmp/res/$name-metrics.jsonl 2>> $log
done
tar czf $OUT/runs.tgz -C /tmp/res .
