#!/bin/bash
# Issue 36 on the GPU machine, call B: pcp sample --backend cuda (IREE) with the modules
# compiled here from call A's StableHLO (steps.py), greedy and at temperature 0.8, and
# GPT-2 small's cached sampling speed with cuda and xla side by side.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/rt/whl/*.whl || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):$PWD/.whl/site:/tmp/site
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PCP_CACHE_DIR=$PWD/.device/sample/cache
chmod 700 $PCP_CACHE_DIR
log=$OUT/call_b_log.txt
run=.device/sample/tiny
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $log 2>&1
sample() {  # NAME, then pcp sample's options
    name=$1; shift
    python3 -m pcp_core sample $run --prompt "ROMEO:" --tokens 200 "$@" \
        > $OUT/text_$name.txt 2>> $log
    echo "== $name: rc=$?" >> $log
}
sample cuda_greedy --top-k 1 --backend cuda
sample cuda_t08 --temperature 0.8 --seed 7 --backend cuda
for backend in cuda xla cuda xla; do
    python3 benchmarks/sample_speed.py --backend $backend --tokens 64 >> $log 2>&1
    echo "== sample_speed $backend: rc=$?" >> $log
    cat benchmarks/results/sample_speed.json >> $OUT/sample_speed_b.txt
done
