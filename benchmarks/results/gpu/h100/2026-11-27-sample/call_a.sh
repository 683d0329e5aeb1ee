#!/bin/bash
# Issue 36 on the GPU machine, call A: pcp sample on the CPU (jax, as today) and with
# --backend xla (jax on the GPU), greedy and at temperature 0.8; GPT-2 small's cached
# sampling speed with xla (benchmarks/sample_speed.py); and the StableHLO of the cached
# sampler's steps as this machine's jax writes them, compiled here for call B.
set -u
here=benchmarks/results/gpu/h100/2026-11-27-sample
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
log=$OUT/call_a_log.txt
run=.device/sample/tiny
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
python3 -c "import jax; print('jax', jax.__version__, jax.devices())" >> $log 2>&1
sample() {  # NAME, then pcp sample's options
    name=$1; shift
    python3 -m pcp_core sample $run --prompt "ROMEO:" --tokens 200 "$@" \
        > $OUT/text_$name.txt 2>> $log
    echo "== $name: rc=$?" >> $log
}
JAX_PLATFORMS=cpu sample cpu_greedy --top-k 1
JAX_PLATFORMS=cpu sample cpu_t08 --temperature 0.8 --seed 7
sample xla_greedy --top-k 1 --backend xla
sample xla_t08 --temperature 0.8 --seed 7 --backend xla
python3 $here/steps.py dump $run /tmp/steps >> $log 2>&1
echo "== dump: rc=$?" >> $log
tar -C /tmp -czf $OUT/steps.tar.gz steps
python3 benchmarks/sample_speed.py --backend xla --tokens 64 >> $log 2>&1
echo "== sample_speed xla: rc=$?" >> $log
cp benchmarks/results/sample_speed.json $OUT/sample_speed_xla.json
