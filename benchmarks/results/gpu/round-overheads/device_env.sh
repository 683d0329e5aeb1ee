# Sourced by this folder's device scripts: the IREE runtime wheel installed beside the
# device's own jax, this checkout's packages on the path, NVLink multicast off, and the
# log in $OUT.
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site:$PWD/benchmarks
log=$OUT/log.txt
nvidia-smi --query-gpu=index,name --format=csv >> $log 2>&1
# GPT-2 small's shape in bf16 on the stdlib corpus, 4 rounds of H = 100
FLAGS="--data .device/stdlib --model-size gpt2-small --precision bf16 --steps 400 --inner-steps 100
       --steps-per-call 10 --lr 6e-4 --warmup-steps 30 --eval-every 100 --seed 0"
