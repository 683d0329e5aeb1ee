# sourced by each call's script, from the repository root on the GPU machine.
# 2026-11-28 (issue 31, the CPU worker's cores): the device material is in .device/unequal2
# (carried), with src/, the code at 79fdd7e (git archive) plus benchmarks/gpu_unequal.py
# of branch gpu-pair, so the runs use that commit and not the checkout's working tree.
# Everything runs from src/: `python -m pcp_core` imports from the working directory.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .device/unequal2/*.whl || exit 1
cd .device/unequal2/src || exit 1
export PYTHONPATH=$(python3 scripts/register_checkout.py /tmp/reg):/tmp/site
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_COMPILATION_CACHE_DIR=/tmp/jaxcache
FLAGS=(--model-size shakespeare-char --data ../tinyshakespeare.txt
       --batch-size 16 --steps-per-call 2 --inner-steps 500 --steps ${STEPS:-10000} --lr 1e-3
       --inner-lr-scaling none --merge tokens --overlap delayed --eval-every 0 --seed 0)
