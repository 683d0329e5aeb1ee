#!/bin/bash
# Issue 35, call 1 on a machine with two GPUs: the program IREE's cuda workers would get
# (dumped, to compile where the IREE compiler is), then the four xla runs of
# benchmarks/multi_gpu.py, GPT-2 small bf16 on the Python standard library (BPE 8192).
# Carried: .whl (structlog, platformdirs, tomli_w in .whl/site), .device/rt (pycapnp and
# iree-base-runtime 3.13.0 wheels for cp312), .device/stdlib (`pcp data prepare` here).
set -u
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site:$PWD/benchmarks
log=$OUT/call1_log.txt
start=$SECONDS
stage() { echo "== $1: rc=$2 at $((SECONDS - start))s" >> $log; }
{ nvidia-smi; nvidia-smi topo -m; env | grep -E 'NCCL|NVSHMEM|MULTICAST'
  python3 -c "import jax, capnp, matplotlib, iree.runtime; print('jax', jax.__version__, jax.devices())"; } >> $log 2>&1
FLAGS="--data .device/stdlib --model-size gpt2-small --precision bf16 --steps 400 --inner-steps 100
       --steps-per-call 10 --lr 6e-4 --warmup-steps 30 --eval-every 100 --seed 0"
timeout 150 python3 benchmarks/multi_gpu.py dump --batch 16 --out /tmp/dump -- $FLAGS >> $log 2>&1
stage dump $?
gzip -c /tmp/dump/program/program.mlir > $OUT/program.mlir.gz; cp /tmp/dump/program/program.json $OUT/
timeout $((575 - (SECONDS - start))) python3 benchmarks/multi_gpu.py run --batch 16 --out /tmp/mg \
    --results $OUT --stem call1 --timeout 200 -- $FLAGS >> $log 2>&1
stage runs $?
(cd /tmp/mg && tar czf $OUT/call1_runs.tgz *.log *.csv */metrics.jsonl */summary.json /tmp/dump/*.log) 2>> $log
